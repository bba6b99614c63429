package envoyrls

import (
	"context"
	"testing"
)

// BenchmarkDecide is one request of 1 or 4 descriptors decided in
// process, without gRPC: the service's own cost.
func BenchmarkDecide(b *testing.B) {
	cfg := mustParse(b, "f.yaml", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`)
	for _, n := range []int{1, 4} {
		b.Run([]string{"", "1", "", "", "4"}[n], func(b *testing.B) {
			mem := NewMemory(0)
			defer mem.Close()
			svc := New(cfg, Options{Backend: mem})
			r := req("d", desc("a", "x"), desc("b", "x"), desc("c", "x"), desc("e", "x"))
			r.Descriptors = r.Descriptors[:n]
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.Decide(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
