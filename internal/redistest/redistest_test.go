package redistest

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testproc.Main(m)) }

func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if err := Ping(s.Addr, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := Do(s.Addr, time.Second, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := Do(s.Addr, time.Second, "GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET = %q, %v", v, err)
	}
	s.NeedOwn(t)
	s.Kill()
	if err := Ping(s.Addr, 100*time.Millisecond); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Restart(t)
	if err := Ping(s.Addr, time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	c := StartCluster(t, 3)
	if len(c.Addrs) != 3 {
		t.Fatalf("addrs %v", c.Addrs)
	}
	info, err := Do(c.Addrs[0], time.Second, "CLUSTER", "INFO")
	if err != nil {
		t.Fatal(err)
	}
	t.Log(info[:40])
}
