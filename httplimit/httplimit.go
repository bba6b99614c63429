// Package httplimit limits HTTP servers and clients with any
// throttle.Limiter: a middleware that keys each request (by client IP,
// behind trusted proxies, or by an API key), answers 429 with Retry-After
// and the IETF RateLimit fields when the limiter denies, and holds
// concurrency limits for the handler's duration; and a RoundTripper that
// waits its turn, or fails fast, before calling a rate-limited upstream.
//
// The middleware and the Transport are safe for concurrent use when their
// limiter is.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/optkit"
	"github.com/throttlekit/throttle/internal/ratefields"
	"github.com/throttlekit/throttle/internal/report"
	"github.com/throttlekit/throttle/internal/unsent"
)

// KeyFunc returns the key a request is limited under. An error wrapping
// throttle.ErrInvalid answers 400; a KeyFunc may also return errors
// wrapping throttle.ErrDenied (403).
type KeyFunc func(*http.Request) (string, error)

// Option configures New.
type Option func(*config)

type config struct {
	key       KeyFunc
	cost      func(*http.Request) int
	name      string
	legacy    bool
	passOnErr bool
	denied    http.Handler
	onError   func(http.ResponseWriter, *http.Request, error)
	obsName   string
	observer  throttle.Observer
	skip      func(*http.Request) bool
	shadow    bool
	ctxLimit  bool
}

// WithKey sets how requests are keyed (default: ClientIP()).
func WithKey(f KeyFunc) Option { return func(c *config) { c.key = f } }

// WithCost sets how many units a request costs (default 1); see
// CostFromContext for a cost an earlier handler sets per request.
func WithCost(f func(*http.Request) int) Option { return func(c *config) { c.cost = f } }

// WithSkip exempts the requests for which f returns true (health checks,
// internal callers): they reach the handler without a decision or
// fields. f must be safe for concurrent use.
func WithSkip(f func(*http.Request) bool) Option { return func(c *config) { c.skip = f } }

// WithShadow decides and reports as usual (the RateLimit fields, the
// observer's events) but refuses nothing: a request the limit would deny,
// or whose key or decision failed, reaches the handler all the same, so a
// new limit can be tried on production traffic. A denial is seen as the
// RateLimit field's r=0 and as the observer's denied decisions (no
// Retry-After is sent). A concurrency limit's units are held when granted.
func WithShadow() Option { return func(c *config) { c.shadow = true } }

// WithLimitFromContext decides a request whose context states a limit
// (WithRequestLimit) under that limit instead of the limiter's own,
// through the limiter's AllowQuota: the limiter must be a
// throttle.QuotaAllower (tokenbucket.Limiter, redislimit's token bucket),
// or New fails. The RateLimit fields state the request's limit, and the
// observer of WithObserver sees the decision as any other.
func WithLimitFromContext() Option { return func(c *config) { c.ctxLimit = true } }

// WithName names the policy in the RateLimit-Policy and RateLimit fields
// (default "default"): middlewares stacked on one route need distinct
// names. It must be printable ASCII.
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithLegacyHeaders also sets X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds, the t of the RateLimit field), as older
// clients expect. They hold one policy: of stacked middlewares, the one
// with the fewest units left.
func WithLegacyHeaders() Option { return func(c *config) { c.legacy = true } }

// WithPassOnUnavailable lets requests through when the limiter's backend
// fails (errors wrapping throttle.ErrUnavailable) instead of answering 503.
func WithPassOnUnavailable() Option { return func(c *config) { c.passOnErr = true } }

// WithDeniedHandler serves denied requests instead of the plain 429. The
// rate-limit fields and Retry-After are set before it runs;
// DecisionFrom(r) returns the Decision.
func WithDeniedHandler(h http.Handler) Option { return func(c *config) { c.denied = h } }

// WithErrorHandler answers requests whose key or decision failed, instead
// of the default status for the error (see New): it writes the response.
// To log the failures, observe them (WithObserver's EventError).
func WithErrorHandler(f func(http.ResponseWriter, *http.Request, error)) Option {
	return func(c *config) { c.onError = f }
}

// WithObserver reports to o, under name, every decision of the
// middleware as throttle.Observe does: an EventDecision, or an EventError
// for a decision that failed or a request whose key could not be had (the
// key func's error, with no Key). name is the limiter's label in metrics; it
// need not be the policy name of WithName. Nil turns it off.
func WithObserver(name string, o throttle.Observer) Option {
	return func(c *config) { c.obsName, c.observer = name, o }
}

// New returns middleware that asks l for each request's cost under its
// key before calling the next handler.
//
// Allowed requests carry RateLimit-Policy (quota q and window w) and
// RateLimit (remaining r, and t, the seconds until more units are
// available: when the next unit returns to a bucket, or the window ends)
// fields, stating the key's own quota when l's limit depends on the key
// (a limiter with a KeyQuota method, such as rules.Limiter), else l's Quota; a key l
// does not limit (an allow list) gets none. Denied
// requests get 429 with Retry-After in whole seconds, rounded up. Errors
// answer 400 (bad key, ErrInvalid), 403 (ErrDenied), 413 (a cost above
// the limit, ErrExceedsLimit) or 503 (ErrUnavailable, unless
// WithPassOnUnavailable; with Retry-After when the decision has one, as
// from an open circuit breaker). A throttle.Holder (a concurrency limit)
// is held while the handler runs and released when it returns or panics.
//
// With http.TimeoutHandler, put the middleware inside it,
// http.TimeoutHandler(limit(h), ...), not limit(http.TimeoutHandler(h,
// ...)): TimeoutHandler returns at its deadline while h goes on running,
// so a concurrency limit outside it would be released with h still
// running, and let more handlers run than its cap.
//
// Errors wrap throttle.ErrInvalid: a nil limiter or key func, or a bad
// name.
func New(l throttle.Limiter, opts ...Option) (func(http.Handler) http.Handler, error) {
	c := config{key: ClientIP(), cost: func(*http.Request) int { return 1 }, name: "default"}
	if err := optkit.Apply(&c, "httplimit", opts); err != nil {
		return nil, err
	}
	if err := c.check(l); err != nil {
		return nil, err
	}
	m := &middleware{config: c, rep: ratefields.NewReporter(l), obs: report.New(c.obsName, c.observer)}
	m.qa, _ = l.(throttle.QuotaAllower)
	_, m.holds = l.(throttle.Holder)
	m.l = throttle.Observe(l, c.obsName, c.observer)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

// check reports a configuration of New for l that cannot work.
func (c *config) check(l throttle.Limiter) error {
	switch {
	case l == nil:
		return fmt.Errorf("%w: httplimit: nil limiter", throttle.ErrInvalid)
	case c.key == nil || c.cost == nil:
		return fmt.Errorf("%w: httplimit: nil key or cost func", throttle.ErrInvalid)
	case !ratefields.ValidName(c.name):
		return fmt.Errorf("%w: httplimit: policy name %q must be 1 to 64 printable ASCII characters", throttle.ErrInvalid, c.name)
	}
	if _, ok := l.(throttle.QuotaAllower); c.ctxLimit && !ok {
		return fmt.Errorf("%w: httplimit: WithLimitFromContext needs a limiter that takes the limit with each call (a throttle.QuotaAllower), not %T", throttle.ErrInvalid, l)
	}
	return nil
}

// middleware is what New returns, for one limiter; it is safe for
// concurrent use.
type middleware struct {
	config
	l     throttle.Limiter      // observed
	qa    throttle.QuotaAllower // the limiter before observing, if one
	rep   ratefields.Reporter   // the quota to state for a key
	obs   report.To             // reports the decisions allowQuota makes
	holds bool                  // l is a throttle.Holder
}

// serve decides r and passes it to next, or answers it.
func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.skip != nil && m.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := m.key(r)
	if err != nil {
		// Not a decision, but reported as a failed one: in shadow mode
		// the observer is the only one to see it.
		m.obs.Call(limiterkit.MethodAllow, "", 1, throttle.Decision{}, err, time.Time{})
		m.fail(w, r, next, err)
		return
	}
	var lim *requestLimit
	if m.ctxLimit {
		lim, _ = r.Context().Value(limitKey{}).(*requestLimit)
	}
	var d throttle.Decision
	release := func() {}
	if lim != nil {
		d, err = m.allowQuota(r, m.qa, key, lim, &m.obs)
	} else {
		d, release, r, err = m.hold(r, key)
	}
	defer release()
	if err != nil {
		m.failed(w, r, next, d, err)
		return
	}
	q, t, limited := m.rep.State(key, d)
	if lim != nil {
		q, t, limited = lim.quota(), ratefields.Until(d, lim.rate), true
	}
	if limited {
		m.setFields(w.Header(), q, t, d)
	}
	if !d.Allowed && !m.shadow {
		m.deny(w, r, d)
		return
	}
	next.ServeHTTP(w, r)
}

// hold asks the limiter for r's units under key. For a Holder, r comes
// back marked (refusal) so that a middleware inside this one that refuses
// it says so, and release then gives the units back as saying nothing
// about the handler, which never ran (an adaptive.Limiter's Outcome is
// Ignored, not a success of a few microseconds).
func (m *middleware) hold(r *http.Request, key string) (throttle.Decision, func(), *http.Request, error) {
	if !m.holds {
		d, release, err := throttle.TryHold(r.Context(), m.l, key, m.cost(r))
		return d, release, r, err
	}
	ctx, h := unsent.Begin(r.Context(), m.l)
	d, release, err := throttle.TryHold(ctx, m.l, key, m.cost(r))
	if err != nil || !d.Allowed {
		h.End(release, nil)
		return d, func() {}, r, err
	}
	f := &refusal{}
	f.outer, _ = r.Context().Value(refusalKey{}).(*refusal)
	r = r.WithContext(context.WithValue(r.Context(), refusalKey{}, f))
	return d, func() {
		var e error
		if f.set.Load() {
			e = unsent.Err
		}
		h.End(release, e)
	}, r, nil
}

// refusal records that a middleware refused a request, for each
// middleware outside it that holds units for it.
type refusal struct {
	set   atomic.Bool
	outer *refusal
}

type refusalKey struct{}

// refused marks r as refused by a middleware, for those outside it.
func refused(r *http.Request) {
	for f, _ := r.Context().Value(refusalKey{}).(*refusal); f != nil; f = f.outer {
		f.set.Store(true)
	}
}

// failed answers r, whose decision d failed with err, or passes it to
// next when the store is unavailable and WithPassOnUnavailable says so.
func (c *config) failed(w http.ResponseWriter, r *http.Request, next http.Handler, d throttle.Decision, err error) {
	if c.passOnErr && errors.Is(err, throttle.ErrUnavailable) {
		next.ServeHTTP(w, r)
		return
	}
	if !c.shadow && d.RetryAfter > 0 && errors.Is(err, throttle.ErrUnavailable) {
		// An open breaker knows when it will try the store again.
		w.Header().Set("Retry-After", strconv.FormatInt(max(ratefields.Seconds(d.RetryAfter), 1), 10))
	}
	c.fail(w, r, next, err)
}

// deny answers r, denied by d: 429 with Retry-After when d states a
// time (a full concurrency limit does not: waiting frees nothing), or the
// WithDenied handler's answer.
func (c *config) deny(w http.ResponseWriter, r *http.Request, d throttle.Decision) {
	refused(r)
	if d.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(ratefields.Seconds(d.RetryAfter), 10))
	}
	if c.denied != nil {
		c.denied.ServeHTTP(w, r.WithContext(withDecision(r.Context(), d)))
		return
	}
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

// statusFor returns the status New answers for a failed key or decision.
func statusFor(err error) int {
	switch {
	case errors.Is(err, throttle.ErrDenied):
		return http.StatusForbidden
	case errors.Is(err, throttle.ErrExceedsLimit):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, throttle.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, throttle.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// fail answers a request whose key or decision failed with err (in shadow
// mode: passes it to next).
func (c *config) fail(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	if c.shadow {
		next.ServeHTTP(w, r)
		return
	}
	refused(r)
	if c.onError != nil {
		c.onError(w, r, err)
		return
	}
	code := statusFor(err)
	http.Error(w, http.StatusText(code), code)
}

// allowQuota decides r under the limit its context states, and reports
// the decision to rep.
func (c *config) allowQuota(r *http.Request, qa throttle.QuotaAllower, key string, lim *requestLimit, rep *report.To) (throttle.Decision, error) {
	n := c.cost(r)
	start := rep.Start()
	d, err := qa.AllowQuota(r.Context(), key, n, lim.rate, lim.burst)
	rep.Call(limiterkit.MethodAllowQuota, key, n, d, err, start)
	return d, err
}

// setFields adds this policy's items, quota q and t, to the
// RateLimit-Policy and RateLimit fields (Add, not Set: stacked
// middlewares each add their own item).
func (c *config) setFields(h http.Header, q throttle.Quota, t time.Duration, d throttle.Decision) {
	// The keys are written in canonical form (as Add and Set would make
	// them), which saves canonicalizing five keys per request.
	h["Ratelimit-Policy"] = append(h["Ratelimit-Policy"], ratefields.Policy(c.name, q))
	h["Ratelimit"] = append(h["Ratelimit"], ratefields.Limit(c.name, d.Remaining, t))
	if c.legacy && legacyFirst(h, d.Remaining) {
		h["X-Ratelimit-Limit"] = []string{strconv.Itoa(q.Limit)}
		h["X-Ratelimit-Remaining"] = []string{strconv.Itoa(max(d.Remaining, 0))}
		h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(ratefields.Seconds(t), 10)}
	}
}

// legacyFirst reports whether the X-RateLimit trio should state a policy
// with remaining units left: the trio holds one policy, so among stacked
// middlewares the one with the fewest units left wins (the outer one on a
// tie), whatever the order they run in.
func legacyFirst(h http.Header, remaining int) bool {
	prev := h["X-Ratelimit-Remaining"]
	if len(prev) == 0 {
		return true
	}
	n, err := strconv.Atoi(prev[0])
	return err != nil || max(remaining, 0) < n
}
