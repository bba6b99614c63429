package etcdtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Cluster is an etcd cluster of several members on loopback, for tests
// that kill its leader. Its methods are safe for concurrent use.
type Cluster struct {
	// Members are the cluster's members, each killable and restartable
	// on its own; Endpoints are their client URLs.
	Members   []*Server
	Endpoints []string
}

// StartCluster returns a running etcd cluster of n members on free
// 127.0.0.1 ports, killed at the end of the test. Without etcd it skips t
// (or fails it under THROTTLE_REQUIRE_ETCD=1); with THROTTLE_ETCD_ENDPOINTS
// set it skips t, since the test wants to kill members.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if os.Getenv(EnvEndpoints) != "" {
		t.Skipf("etcdtest: %s is set: the test starts and kills a cluster of its own", EnvEndpoints)
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testproc.Unavailable(t, EnvRequire, "etcd unavailable: etcd not found in PATH (build it from internal/tools/etcd, see CONTRIBUTING)")
	}
	ports, err := testproc.FreePorts(2 * n)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	c := &Cluster{}
	var peers []string
	for i := range n {
		s := &Server{bin: bin, dir: t.TempDir(), clientPort: ports[2*i], peerPort: ports[2*i+1], name: fmt.Sprintf("m%d", i)}
		s.Endpoints = []string{s.url(s.clientPort)}
		peers = append(peers, s.name+"="+s.url(s.peerPort))
		c.Members, c.Endpoints = append(c.Members, s), append(c.Endpoints, s.Endpoints[0])
		t.Cleanup(s.Kill)
	}
	// A member is healthy only once a quorum has elected a leader: start
	// them all at once.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Members {
		s.cluster = strings.Join(peers, ",")
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("etcdtest: cluster: %v", err)
	}
	return c
}

// Leader returns the member that is the cluster's leader, as the members
// that answer within timeout report it; it fails t if there is none.
func (c *Cluster) Leader(t testing.TB, timeout time.Duration) *Server {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, s := range c.Members {
			st, err := status(s.Endpoints[0])
			if err == nil && st.Leader != "" && st.Leader == st.Header.MemberID {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: no leader within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// memberStatus is the part of a member's status answer Leader reads: the
// ids come as decimal strings.
type memberStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

// status asks the member at endpoint for its status over etcd's JSON
// gateway.
func status(endpoint string) (memberStatus, error) {
	var st memberStatus
	hc := http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Post(endpoint+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}
