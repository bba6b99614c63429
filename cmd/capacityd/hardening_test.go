package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
	"github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1/capacityv1connect"
	"github.com/throttlekit/throttle/internal/testproc"
)

// refusingParent answers every GetCapacity with ResourceExhausted.
type refusingParent struct {
	capacityv1connect.UnimplementedCapacityServiceHandler
}

func (refusingParent) GetCapacity(context.Context, *connect.Request[capacityv1.GetCapacityRequest]) (*connect.Response[capacityv1.GetCapacityResponse], error) {
	return nil, connect.NewError(connect.CodeResourceExhausted, nil)
}

// TestHealthzParentRefuses: a leaf whose parent refuses its requests is
// unhealthy (503, naming the refusal), not "ok".
func TestHealthzParentRefuses(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(capacityv1connect.NewCapacityServiceHandler(refusingParent{}))
	parent := httptest.NewServer(mux)
	defer parent.Close()
	leaf := startTest(t, `{"listen": "127.0.0.1:0", "admin": "127.0.0.1:0", "parent": ["`+strings.TrimPrefix(parent.URL, "http://")+`"], "resources": [
		{"id": "*", "capacity": 1000, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	leaf.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"db","wants":5}]}`, nil)
	eventually(t, "/healthz reports the refusing parent", func() bool {
		code, body := leaf.get(t, leaf.adminURL()+"/healthz")
		return code == 503 && strings.Contains(body, "parent refuses")
	})
}

// TestMetricsBoundedSeries: resource ids that clients make up get no
// series of their own; they are counted in their template's.
func TestMetricsBoundedSeries(t *testing.T) {
	a := startTest(t, testConfig)
	for i := range 10 {
		var b strings.Builder
		for j := range 100 {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"resourceId":"made-up-%d-%d","wants":1}`, i, j)
		}
		if code := a.call(t, "GetCapacity", `{"clientId":"attacker","resources":[`+b.String()+`]}`, nil); code != 200 {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	_, m := a.get(t, a.adminURL()+"/metrics")
	if n := strings.Count(m, "made-up-"); n != 0 {
		t.Errorf("/metrics has %d series labelled with made-up ids", n)
	}
	if !strings.Contains(m, `capacityd_template_resources{template="*"} 1000`) {
		t.Errorf("/metrics lacks the catch-all template's 1000 resources")
	}
}

// TestLimitsConfig: the configuration's limits reach the server: a client
// beyond its bound of leases gets ResourceExhausted naming it.
func TestLimitsConfig(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "limits": {"max_leases_per_client": 2}, "resources": [{"id": "*", "capacity": 10}]}`)
	var e struct{ Code, Message string }
	code := a.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"a","wants":1},{"resourceId":"b","wants":1},{"resourceId":"c","wants":1}]}`, &e)
	if code != 429 || e.Code != "resource_exhausted" || !strings.Contains(e.Message, `client "c1"`) {
		t.Fatalf("%d %+v", code, e)
	}
	if code := a.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"a","wants":1},{"resourceId":"b","wants":1}]}`, nil); code != 200 {
		t.Fatalf("within the bound: %d", code)
	}
}

// trickle opens a connection to addr, sends head, then one byte of body
// every 50ms until the server closes the connection or stop is closed; the
// returned channel is closed when the server has closed it.
func trickle(t *testing.T, addr, head string, body byte, stop <-chan struct{}) <-chan struct{} {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, c) // returns when the server closes
	}()
	go func() {
		defer c.Close()
		if _, err := io.WriteString(c, head); err != nil {
			return
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-closed:
				return
			case <-tick.C:
				if _, err := c.Write([]byte{body}); err != nil {
					return
				}
			}
		}
	}()
	return closed
}

// TestSlowLoris: clients that trickle their requests (a body on the API
// port, headers on the admin port), more of them than either port takes
// at once, neither keep their connections beyond the read timeouts nor
// lock /healthz and GetCapacity out.
func TestSlowLoris(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
		"http": {"read_header_timeout": "500ms", "read_timeout": "1s", "max_connections": 40, "admin_max_connections": 8},
		"resources": [{"id": "*", "capacity": 10}]}`)
	stop := make(chan struct{})
	defer close(stop)
	var conns []<-chan struct{}
	for range 60 {
		conns = append(conns, trickle(t, a.apiLn.Addr().String(), "POST "+getCapacityMethod+" HTTP/1.1\r\n"+
			"Host: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", ' ', stop))
	}
	for range 20 {
		conns = append(conns, trickle(t, a.adminLn.Addr().String(), "GET /healthz HTTP/1.1\r\nX-Slow: ", 'a', stop))
	}
	eventually(t, "/healthz answers", func() bool {
		a.hc.CloseIdleConnections()
		code, _ := getBody(a.hc, a.adminURL()+"/healthz")
		return code == 200
	})
	eventually(t, "GetCapacity answers", func() bool { return a.answers("c1") })
	allClosed(t, conns, time.Now(), 10*time.Second)
}

// TestErrorsNameTheCommandOnce: a refused configuration's error does not
// name the command: the exit path prefixes "capacityd: " once.
func TestErrorsNameTheCommandOnce(t *testing.T) {
	for _, cfg := range []string{
		`{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": -1}]}`,
		`{"listen": "127.0.0.1:1", "bogus": 1}`,
	} {
		err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", cfg)}, io.Discard, io.Discard)
		if err == nil || strings.Contains(err.Error(), "capacityd:") {
			t.Errorf("error %q: want one without the command's name", err)
		}
	}
}
