package throttle_test

import (
	"io"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// capability is a set of the optional interfaces a limiter may implement,
// which wrappers (Decorate, Wait, failsafe, httplimit, rules) look for.
type capability uint8

const (
	limiter capability = 1 << iota
	reserver
	holder
	quotaReporter
	quotaAllower
	closer
)

var capabilities = []struct {
	c    capability
	name string
	in   func(any) bool
}{
	{limiter, "Limiter", implements[throttle.Limiter]},
	{reserver, "Reserver", implements[throttle.Reserver]},
	{holder, "Holder", implements[throttle.Holder]},
	{quotaReporter, "QuotaReporter", implements[throttle.QuotaReporter]},
	{quotaAllower, "QuotaAllower", implements[throttle.QuotaAllower]},
	{closer, "io.Closer", implements[io.Closer]},
}

func implements[I any](v any) bool { _, ok := v.(I); return ok }

func (c capability) String() string {
	var names []string
	for _, k := range capabilities {
		if c&k.c != 0 {
			names = append(names, k.name)
		}
	}
	return strings.Join(names, "|")
}

// TestCapabilities lists every limiter type of the module with exactly the
// capabilities it has: one it must have and lacks fails, and so does one
// it gains unlisted (a change of API that wrappers would pass on).
func TestCapabilities(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want capability
	}{
		{(*tokenbucket.Bucket)(nil), limiter | reserver | quotaReporter},
		{(*tokenbucket.Limiter)(nil), limiter | reserver | quotaReporter | quotaAllower | closer},
		{(*leakybucket.Bucket)(nil), limiter | reserver | quotaReporter},
		{(*leakybucket.Limiter)(nil), limiter | reserver | quotaReporter | closer},
		{(*leakybucket.Pacer)(nil), limiter | quotaReporter},
		{(*fixedwindow.Window)(nil), limiter | quotaReporter},
		{(*fixedwindow.Limiter)(nil), limiter | quotaReporter | closer},
		{(*slidingwindow.Window)(nil), limiter | quotaReporter},
		{(*slidingwindow.Limiter)(nil), limiter | quotaReporter | closer},
		{(*slidinglog.Log)(nil), limiter | quotaReporter},
		{(*slidinglog.Limiter)(nil), limiter | quotaReporter | closer},
		{(*counting.Semaphore)(nil), limiter | holder | quotaReporter},
		{(*counting.Limiter)(nil), limiter | holder | quotaReporter | closer},
		{(*adaptive.Limiter)(nil), limiter | holder | quotaReporter},
		{(*adaptive.Keyed)(nil), limiter | holder},
		{(*adaptive.Throttler)(nil), limiter},
		{(*rules.Limiter)(nil), limiter | reserver | closer},
		{(*storelimit.Limiter)(nil), limiter | quotaReporter | closer},
		{throttle.LimiterFunc(nil), limiter},
	} {
		var got capability
		for _, k := range capabilities {
			if k.in(tt.v) {
				got |= k.c
			}
		}
		if got != tt.want {
			t.Errorf("%T implements %v, want %v", tt.v, got, tt.want)
		}
	}
}
