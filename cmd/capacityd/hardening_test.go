package main

import (
	"context"
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
