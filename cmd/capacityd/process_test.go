package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/etcdtest"
	"github.com/throttlekit/throttle/internal/testproc"
)

var (
	buildOnce sync.Once
	binDir    string
	binErr    error
)

// binary builds capacityd once per test run, outside the repository.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "capacityd-test"); binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "capacityd"), ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "capacityd")
}

// proc is a capacityd process.
type proc struct {
	*testproc.Proc
	cmd              *exec.Cmd
	api, admin, path string
}

// startProc runs capacityd on cfg (whose listen and admin addresses are
// replaced by free loopback ports) and waits until /healthz answers
// (any status: a follower may not know the master yet).
func startProc(t *testing.T, hc *http.Client, cfg string) *proc {
	t.Helper()
	var p *proc
	err := testproc.Retry(5, func() error {
		ports, err := testproc.FreePorts(2)
		if err != nil {
			return err
		}
		p, err = launch(t, hc, cfg, fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// restartProc runs capacityd again on p's configuration and ports (a
// killed process's ports may linger for a moment).
func restartProc(t *testing.T, hc *http.Client, p *proc, cfg string) *proc {
	t.Helper()
	var q *proc
	err := testproc.RetryFor(10*time.Second, func() (err error) {
		q, err = launch(t, hc, cfg, p.api, p.admin)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Kill)
	return q
}

// launch runs capacityd on cfg with API and ADMIN replaced by api and
// admin, and waits until /healthz answers.
func launch(t *testing.T, hc *http.Client, cfg, api, admin string) (*proc, error) {
	return launchUntil(t, cfg, api, admin, func() error {
		resp, err := hc.Get("http://" + admin + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// launchUntil runs capacityd on cfg with API and ADMIN replaced by api
// and admin, and waits until ready returns nil.
func launchUntil(t *testing.T, cfg, api, admin string, ready func() error) (*proc, error) {
	c := strings.Replace(strings.Replace(cfg, "API", api, -1), "ADMIN", admin, -1)
	path := testproc.WriteFile(t, "capacityd.json", c)
	cmd := exec.Command(binary(t), "-config", path, "-log-level", "debug")
	tp, err := testproc.Start(cmd, 20*time.Second, ready)
	if err != nil {
		return nil, err
	}
	return &proc{Proc: tp, cmd: cmd, api: api, admin: admin, path: path}, nil
}

func health(hc *http.Client, p *proc) string {
	code, body := getBody(hc, "http://"+p.admin+"/healthz")
	return fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
}

// stopProc sends SIGTERM and checks that the process exits 0 within d.
func stopProc(t *testing.T, p *proc, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(d):
		t.Fatalf("still running %v after SIGTERM; output:\n%s", d, p.Output())
	}
	took := time.Since(t0)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "msg=stopped") {
		t.Fatalf("no clean stop in the log:\n%s", p.Output())
	}
	return took
}

func newHTTPClient(t *testing.T) *http.Client {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// The binary serves, finishes, and exits 0 soon after SIGTERM.
func TestProcessGracefulStop(t *testing.T) {
	hc := newHTTPClient(t)
	p := startProc(t, hc, strings.Replace(testConfig, `"listen": "127.0.0.1:0", "admin": "127.0.0.1:0"`, `"listen": "API", "admin": "ADMIN"`, 1))
	if h := health(hc, p); !strings.HasPrefix(h, "200 ok master") {
		t.Fatalf("/healthz: %s", h)
	}
	tr := capacity.NewHTTPTransport(hc, connect.WithProtoJSON())
	resp, err := tr.GetCapacity(context.Background(), p.api, &capacity.Request{Client: "c1",
		Resources: []capacity.ResourceRequest{{Resource: "db.writes", Wants: 7, Has: 7}}})
	if err != nil || len(resp.Grants) != 1 || resp.Grants[0].Capacity != 7 {
		t.Fatalf("GetCapacity: %+v, %v", resp, err)
	}
	took := stopProc(t, p, 5*time.Second)
	t.Logf("exit 0 %v after SIGTERM", took)
}

// A SIGTERM sent the moment the API port accepts connections, while
// capacityd is still starting, stops it as cleanly as a later one (exit
// 0): it registers for signals before it binds a port. Before, the
// signal's default action killed it in that window (exit code -1).
func TestProcessStopWhileStarting(t *testing.T) {
	cfg := strings.Replace(testConfig, `"listen": "127.0.0.1:0", "admin": "127.0.0.1:0"`, `"listen": "API", "admin": "ADMIN"`, 1)
	err := testproc.SignalAtStart(20, syscall.SIGTERM, "msg=stopped", func() (*testproc.Proc, error) {
		ports, err := testproc.FreePorts(2)
		if err != nil {
			return nil, err
		}
		api := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p, err := launchUntil(t, cfg, api, fmt.Sprintf("127.0.0.1:%d", ports[1]), testproc.Bound("tcp", api))
		if err != nil {
			return nil, err
		}
		return p.Proc, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Two replicas elect a master on a real etcd; when the master is killed
// the other takes over within the TTL and a client given both addresses
// keeps its lease through the new master.
func TestProcessFailover(t *testing.T) {
	etcd := etcdtest.Start(t)
	hc := newHTTPClient(t)
	cfg := `{"listen": "API", "admin": "ADMIN", "etcd": {"endpoints": ["` + strings.Join(etcd.Endpoints, `","`) + `"],
		"prefix": "/capacityd-test/` + t.Name() + `", "ttl": "2s"},
		"resources": [{"id": "*", "capacity": 100, "lease_length": "2s", "refresh_interval": "300ms"}]}`
	a := startProc(t, hc, cfg)
	eventually(t, "a is the master", func() bool { return strings.HasPrefix(health(hc, a), "200 ok master") })
	b := startProc(t, hc, cfg)
	eventually(t, "b follows a", func() bool { return strings.HasPrefix(health(hc, b), "200 ok follower of "+a.api) })

	client, r := holdLease(t, capacity.NewHTTPTransport(hc, connect.WithProtoJSON()), []string{b.api, a.api}, "c1", 10)

	a.Kill()
	t0 := time.Now()
	eventually(t, "b takes over", func() bool { return strings.HasPrefix(health(hc, b), "200 ok master") })
	took := time.Since(t0)
	// etcd expires the lease at most a TTL after its last renewal, and
	// checks for expired leases every 500ms; then the watch reports it.
	if took > 4*time.Second {
		t.Fatalf("b took over %v after the master died, TTL 2s", took)
	}
	// The client finds the new master and gets its lease back: b,
	// learning, confirms what it holds. b counts the grant before its
	// answer reaches the client, and the client's lease (2 s) may have
	// run out during a takeover of up to 4 s, so the client's capacity
	// is waited for too (it was read at once, and was 0 once under load).
	eventually(t, "b knows the client's lease", func() bool {
		_, m := getBody(hc, "http://"+b.admin+"/metrics")
		return strings.Contains(m, `capacityd_template_granted{template="*"} 10`)
	})
	eventually(t, "the client holds 10 again", func() bool { return r.Capacity() == 10 })
	t.Logf("takeover %v after the master was killed", took)

	// A master stopped with SIGTERM gives mastership up: a third replica
	// takes over at once, not a TTL later, and the client follows.
	c := startProc(t, hc, cfg)
	eventually(t, "c follows b", func() bool { return strings.HasPrefix(health(hc, c), "200 ok follower of "+b.api) })
	client.Close()
	client, err := capacity.NewClient(capacity.NewHTTPTransport(hc, connect.WithProtoJSON()), []string{a.api, b.api, c.api},
		capacity.WithClientID("c1"), capacity.WithRetry(100*time.Millisecond), capacity.WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err = client.Resource("db", 10); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	stopProc(t, b, 5*time.Second)
	eventually(t, "c takes over", func() bool { return strings.HasPrefix(health(hc, c), "200 ok master") })
	if took := time.Since(t0); took > 1500*time.Millisecond {
		t.Fatalf("c took over %v after the master stopped: it did not give mastership up", took)
	} else {
		t.Logf("handover %v after SIGTERM to the master", took)
	}
	eventually(t, "the client asks c", func() bool {
		_, m := getBody(hc, "http://"+c.admin+"/metrics")
		return strings.Contains(m, `capacityd_template_clients{template="*"} 1`)
	})
	stopProc(t, c, 5*time.Second)
}

// getBody returns the status and body of a GET, 0 and "" on failure.
func getBody(hc *http.Client, url string) (int, string) {
	resp, err := hc.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
