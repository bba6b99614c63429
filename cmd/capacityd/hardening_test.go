package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
	"github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1/capacityv1connect"
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
