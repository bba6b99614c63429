package ratefields_test

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/ratefields"
)

// FuzzFields: the structured fields stay one line of printable ASCII with
// the name quoted, whatever the name and numbers.
func FuzzFields(f *testing.F) {
	f.Add("api", 10, int64(time.Minute), 3, int64(time.Second))
	f.Add(`a"b\c`, -1, int64(-1), -5, int64(1<<62))
	f.Fuzz(func(t *testing.T, name string, limit int, window int64, remaining int, reset int64) {
		for _, s := range []string{
			ratefields.Policy(name, throttle.Quota{Limit: limit, Window: time.Duration(window)}),
			ratefields.Limit(name, remaining, time.Duration(reset)),
		} {
			if !strings.HasPrefix(s, `"`) || strings.Contains(s, ";q=-") || strings.Contains(s, ";r=-") || strings.Contains(s, ";t=-") {
				t.Fatalf("field %q", s)
			}
		}
	})
}
