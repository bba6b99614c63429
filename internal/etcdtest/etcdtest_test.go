package etcdtest

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testproc.Main(m)) }

// call posts a JSON body to etcd's HTTP gateway and returns the reply.
func call(t *testing.T, endpoint, path, body string) string {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(endpoint+path, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %s", path, resp.Status, b)
	}
	return string(b)
}

func TestStartPauseResumeKillRestart(t *testing.T) {
	s := Start(t)
	e := s.Endpoints[0]
	if err := Healthy(e, time.Second); err != nil {
		t.Fatal(err)
	}
	// key "foo" = "bar", base64-encoded for the JSON gateway.
	call(t, e, "/v3/kv/put", `{"key":"Zm9v","value":"YmFy"}`)
	s.NeedOwn(t)

	s.Pause(t)
	if err := Healthy(e, 300*time.Millisecond); err == nil {
		t.Fatal("paused etcd answered /health")
	}
	s.Resume(t)
	if err := waitHealthy(e, 5*time.Second); err != nil {
		t.Fatalf("after Resume: %v", err)
	}

	s.Kill()
	if err := Healthy(e, 300*time.Millisecond); err == nil {
		t.Fatal("killed etcd answered /health")
	}
	s.Restart(t)
	if err := Healthy(e, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := call(t, e, "/v3/kv/range", `{"key":"Zm9v"}`); !strings.Contains(got, `"value":"YmFy"`) {
		t.Fatalf("data lost across restart: %s", got)
	}

	s.Pause(t)
	s.Kill() // kills a paused server too
	s.Kill() // and is idempotent
}

// TestCluster: a cluster of three members elects a leader; once the
// leader is killed the other two elect another, and the killed member
// comes back with its data.
func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	l := c.Leader(t, 5*time.Second)
	l.Kill()
	rest := &Cluster{}
	for _, m := range c.Members {
		if m != l {
			rest.Members = append(rest.Members, m)
		}
	}
	if l2 := rest.Leader(t, 10*time.Second); l2 == l {
		t.Fatal("the killed member is still the leader")
	}
	l.Restart(t)
	if err := Healthy(l.Endpoints[0], 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
