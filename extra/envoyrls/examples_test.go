package envoyrls

import (
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The tests of this file follow the configuration behaviours the
// reference documents (its README's examples 1 to 11), each asked over
// real gRPC with the go-control-plane client, on a fake clock.

// Two values of one key get their own counters.
func TestExample1ValuesOfOneKey(t *testing.T) {
	r := newRig(t, `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 3}
`, Options{})
	r.wantAdmitted("users", 5, 8, "mongo_cps", "database", "users")
	r.wantAdmitted("default", 3, 8, "mongo_cps", "database", "default")
	r.wantAdmitted("a value without a rule", 2, 2, "mongo_cps", "database", "other")
	r.clock.Add(time.Second)
	r.wantAdmitted("next second", 5, 8, "mongo_cps", "database", "users")
}

// Nested descriptors and several descriptors in one request: the answer
// is OVER_LIMIT when any descriptor is; every descriptor is charged.
func TestExample2NestedAndSeveral(t *testing.T) {
	r := newRig(t, `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 7}
`, Options{})
	for i := range 8 {
		resp := r.ask("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
		wantNested, wantFlat := codeOK, codeOK
		if i >= 5 {
			wantNested = codeOver
		}
		if i >= 7 {
			wantFlat = codeOver
		}
		if resp.Statuses[0].Code != wantNested || resp.Statuses[1].Code != wantFlat {
			t.Fatalf("request %d: statuses %v, %v; want %v, %v", i, resp.Statuses[0].Code, resp.Statuses[1].Code, wantNested, wantFlat)
		}
		if want := max(wantNested, wantFlat); resp.OverallCode != want {
			t.Fatalf("request %d: overall %v, want %v", i, resp.OverallCode, want)
		}
	}
	// Each number has its own counters.
	r.wantAdmitted("another number", 5, 6, "messaging", "message_type", "marketing", "to_number", "2062222222")
	// The placeholder level has no limit of its own.
	r.wantAdmitted("the placeholder alone", 3, 3, "messaging", "message_type", "marketing")
}

// A key with a value is matched before the key alone; a limit of 0 refuses all.
func TestExample3MostSpecificFirst(t *testing.T) {
	r := newRig(t, `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`, Options{})
	r.wantAdmitted("50.0.0.1", 10, 12, "edge_proxy_per_ip", "remote_address", "50.0.0.1")
	r.wantAdmitted("the listed address", 0, 3, "edge_proxy_per_ip", "remote_address", "50.0.0.5")
}

// A rule applies only at the depth of the request's descriptor.
func TestExample4SameDepthOnly(t *testing.T) {
	shallow := newRig(t, `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 1, unit: second}
`, Options{})
	resp := shallow.ask("example4", desc("key", "value", "subkey", "subvalue"), desc("key", "value"), desc("key", "value"))
	if resp.Statuses[0].CurrentLimit != nil || resp.Statuses[0].Code != codeOK {
		t.Errorf("a deeper descriptor matched a shallower rule: %v", resp.Statuses[0])
	}
	if resp.Statuses[2].Code != codeOver {
		t.Errorf("the rule's own depth is not limited: %v", resp.Statuses[2])
	}
	deep := newRig(t, `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 1, unit: second}
`, Options{})
	resp = deep.ask("example4", desc("key", "value", "subkey", "subvalue"), desc("key", "value", "subkey", "subvalue"))
	if resp.Statuses[0].Code != codeOK || resp.Statuses[1].Code != codeOver {
		t.Errorf("nested rule: statuses %v", resp.Statuses)
	}
}

// Unlimited: OK with MaxUint32 remaining, nothing charged.
func TestExample5Unlimited(t *testing.T) {
	r := newRig(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 2}
`, Options{})
	for range 5 {
		resp := r.ask("internal", desc("ldap", "x"))
		if st := resp.Statuses[0]; st.Code != codeOK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
			t.Fatalf("unlimited status %v", st)
		}
	}
	r.wantAdmitted("azure", 2, 3, "internal", "azure", "x")
}

// Shadow mode: OK whatever the count, the breach counted in the metrics.
func TestExample6ShadowMode(t *testing.T) {
	r := newRig(t, `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 2, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 3, unit: second}
`, Options{})
	r.wantAdmitted("user-a (shadow)", 5, 5, "example6", "service", "auth", "user", "user-a")
	r.wantAdmitted("user-b", 3, 5, "example6", "service", "auth", "user", "user-b")
	st := r.svc.metrics.stats("example6.service.user_user-a")
	if st.shadow.Load() != 3 || st.over.Load() != 3 || st.total.Load() != 5 {
		t.Errorf("shadow metrics: total %d over %d shadow %d, want 5, 3, 3", st.total.Load(), st.over.Load(), st.shadow.Load())
	}
}

// replaces: the replaced rule is neither applied nor charged.
func TestExample7Replaces(t *testing.T) {
	r := newRig(t, `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`, Options{})
	one, two := desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")
	for i := range 10 {
		resp := r.ask("example7", one, two)
		if resp.OverallCode != codeOK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("request %d with both: %v", i, resp)
		}
	}
	if resp := r.ask("example7", one, two); resp.OverallCode != codeOver {
		t.Fatalf("11th with both: %v, want OVER_LIMIT (10/s)", resp.OverallCode)
	}
	// The replaced rule's own counter was not touched.
	r.wantAdmitted("specific_limit alone", 5, 6, "example7", "key_1", "value_1", "user", "bkthomps")
}

// detailed_metric: unlisted values are reported under their own key.
func TestExample8DetailedMetric(t *testing.T) {
	r := newRig(t, `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`, Options{})
	r.ask("example8", desc("key1", "a"), desc("key1", "b"), desc("key1", "value1"))
	r.wantOneHit("example8.key1_a", "example8.key1_b", "example8.key1_value1")
}

// Wildcards: trailing, middle, several; each matching value has its own counter.
func TestExample9Wildcards(t *testing.T) {
	r := newRig(t, `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 2}
`, Options{})
	for _, c := range []struct {
		key, value string
		limited    bool
	}{
		{"key1", "value1", true}, {"key1", "valueXYZ", true}, {"key1", "value", true}, {"key1", "other", false},
		{"path", "/api/123/action", true}, {"path", "/api/123/other", false},
		{"route", "/api/v1/resource/123/action", true}, {"route", "/api/v1/resource/action", false},
	} {
		want := 2
		if !c.limited {
			want = 3
		}
		r.wantAdmitted(c.key+"="+c.value, want, 3, "example9", c.key, c.value)
	}
}

// value_to_metric: the runtime values are in the metric key.
func TestExample10ValueToMetric(t *testing.T) {
	r := newRig(t, `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`, Options{})
	r.ask("example10", desc("route", "api", "http_method", "GET", "subject_id", "123"),
		desc("route", "web", "http_method", "POST", "subject_id", "456"),
		desc("user", "alice", "action", "readfile", "resource", "documents"))
	r.wantOneHit("example10.route_api.http_method_GET.subject_id", "example10.route_web.http_method_POST.subject_id",
		"example10.user_alice.action_readfile.resource")
}

// share_threshold: the values a wildcard matches share one counter.
func TestExample11ShareThreshold(t *testing.T) {
	r := newRig(t, `
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
`, Options{})
	if got := r.admitted(5, "example11", "files", "files/a.pdf") + r.admitted(5, "example11", "files", "files/b.csv"); got != 10 {
		t.Fatalf("shared: %d admitted, want 10", got)
	}
	if got := r.admitted(1, "example11", "files", "files/c.txt"); got != 0 {
		t.Errorf("a third file past the shared threshold: admitted")
	}
	r.wantAdmitted("not shared a.pdf", 10, 11, "example11", "files_no_share", "files_no_share/a.pdf")
	r.wantAdmitted("not shared b.csv", 10, 10, "example11", "files_no_share", "files_no_share/b.csv")
}

// The request fields: hits_addend (0 means 1), the per-descriptor
// hits_addend (0 checks without charging), the limit override, the
// status fields, and the response headers.
func TestRequestFields(t *testing.T) {
	r := newRig(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10, name: ten}
`, Options{ResponseHeaders: true})
	resp, err := r.client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3Desc{desc("k", "a")}, HitsAddend: 4})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Statuses[0]
	if st.Code != codeOK || st.LimitRemaining != 6 || st.CurrentLimit.RequestsPerUnit != 10 || st.CurrentLimit.Name != "ten" ||
		st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.DurationUntilReset.AsDuration() != 50*time.Second {
		t.Errorf("status %v", st)
	}
	hdr := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	if hdr["RateLimit-Limit"] != "10" || hdr["RateLimit-Remaining"] != "6" || hdr["RateLimit-Reset"] != "50" {
		t.Errorf("headers %v", hdr)
	}
	if st := r.ask("d", withHits(desc("k", "a"), 0)).Statuses[0]; st.LimitRemaining != 6 {
		t.Errorf("hits_addend 0 on the descriptor charged: remaining %d, want 6", st.LimitRemaining)
	}
	// 7 hits over the 6 left: refused, and charged (the reference's INCRBY).
	if st := r.ask("d", withHits(desc("k", "a"), 7)).Statuses[0]; st.Code != codeOver || st.LimitRemaining != 0 {
		t.Errorf("7 hits: %v", st)
	}
	if st := r.ask("d", desc("k", "a")).Statuses[0]; st.Code != codeOver {
		t.Errorf("the refused hits were not charged: %v", st)
	}
	over := desc("k", "b")
	over.Limit = &rlv3Override{RequestsPerUnit: 1, Unit: 3}
	for i, want := range []rlsv3.RateLimitResponse_Code{codeOK, codeOver} {
		if st := r.ask("d", over).Statuses[0]; st.Code != want || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("override, request %d: %v", i, st)
		}
	}
}
