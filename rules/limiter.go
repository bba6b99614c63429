package rules

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/optkit"
	"github.com/throttlekit/throttle/internal/report"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/tokenbucket"
)

// The setters a reload uses to change a limit in place.
type (
	rateSetter interface {
		SetRate(throttle.Rate) error
		SetBurst(int) error
	}
	limitSetter interface {
		SetLimit(int) error
	}
)

// errDenied is what Allow and Reserve return for a key on the deny list.
var errDenied = fmt.Errorf("rules: key is on the deny list: %w", throttle.ErrDenied)

var (
	errZero   = fmt.Errorf("%w: rules: zero Limiter, use New or Open", throttle.ErrInvalid)
	errClosed = fmt.Errorf("rules: %w", throttle.ErrClosed)
)

// Option configures New and Open.
type Option func(*config)

type config struct {
	factory  func(id string, lim Limit) (throttle.Limiter, error)
	custom   bool
	qa       throttle.QuotaAllower
	limOpts  []throttle.Option
	tierOf   func(string) string
	name     string
	observer throttle.Observer
	onError  func(error)
}

// WithFactory builds each limit's limiter with f. The default builds a
// tokenbucket.Limiter for a bucket limit and a slidingwindow.Limiter for a
// window limit, with the options of WithLimiterOptions.
//
// id names the limit ("default", "tier free", `prefix "api:"`, ...) and
// stays the same across reloads; lim is in bucket or window form. The
// limiter is keyed: it is given the caller's key. If it has SetRate and
// SetBurst (bucket form) or SetLimit (window form), a reload that changes
// lim adjusts it in place instead of building a new one; if it has Close,
// it is closed when a reload drops or replaces it, and by Limiter.Close.
func WithFactory(f func(id string, lim Limit) (throttle.Limiter, error)) Option {
	return func(c *config) { c.factory, c.custom = f, f != nil }
}

// WithQuotaAllower sends every bucket limit to q, which is told the
// rule's rate and burst on each call (for instance a Redis token bucket
// shared by a fleet). Window limits still go to the factory; unless
// WithFactory is also given, a document with window limits is rejected,
// so that no limit is silently local.
func WithQuotaAllower(q throttle.QuotaAllower) Option { return func(c *config) { c.qa = q } }

// WithLimiterOptions passes opts (a clock, key bounds) to the default
// factory's limiters, and its key bounds to the allow list.
func WithLimiterOptions(opts ...throttle.Option) Option {
	return func(c *config) { c.limOpts = append(c.limOpts, opts...) }
}

// WithTierFunc names the tier of each key that no rule matches; "" means
// none (the default applies). f is called on every such decision and must
// be safe for concurrent use. A name the document has no tier for makes
// Allow fail with an error wrapping throttle.ErrInvalid.
func WithTierFunc(f func(key string) string) Option { return func(c *config) { c.tierOf = f } }

// WithTierMap is WithTierFunc over a copy of m: key → tier name.
func WithTierMap(m map[string]string) Option {
	cp := make(map[string]string, len(m))
	for k, v := range m {
		cp[k] = v
	}
	return WithTierFunc(func(key string) string { return cp[key] })
}

// WithObserver reports to o, under name, every call of Allow and Reserve
// as throttle.Observe does (an EventDecision, or an EventError for a call
// that failed, a deny list's included), and each reload: rules put in
// force as an EventReload with their version in Key, a rejected document
// as an EventWarning with the error in Err. o must not block; it is
// called with the Limiter's reload lock held for the reload events, so
// it must not call Update, Reload or Refresh.
func WithObserver(name string, o throttle.Observer) Option {
	return func(c *config) { c.name, c.observer = name, o }
}

// WithErrorFunc calls f with each failure an operator may want to log: a
// reload from the file (Reload and Watch) or a Source (Refresh and
// Follow) that was rejected, and why (the rules in force stay). Rules put
// in force are seen as WithObserver's EventReload, or Version. f is
// called with the Limiter's reload lock held: it must not call Update,
// Reload or Refresh.
func WithErrorFunc(f func(error)) Option { return func(c *config) { c.onError = f } }

// Limiter routes each key to the limit its rules give it. Allow and
// Reserve are safe for concurrent use with each other and with Update,
// Reload, Watch, Refresh, Follow and Close; routing a key to its limit
// takes no lock and allocates nothing, and tries only the patterns that
// could match the key (they are indexed by their literal head or tail,
// and those with a wildcard at both ends by their longest literal run,
// found in one pass over the key). The zero value is not usable: its
// methods fail with an error wrapping throttle.ErrInvalid.
//
// For a key, in order: the deny list refuses it (an error wrapping
// throttle.ErrDenied); the allow list admits it without limit (a Decision
// with Allowed true and a zero Limit); the most specific rule decides (an
// exact key, else the prefix or pattern with the most literal bytes);
// else the tier named by WithTierFunc; else the default.
//
// Each limit (the default, each tier, each rule that states its own limit)
// has one keyed limiter, so the keys matching a prefix each get the
// prefix's limit, separately. A reload that changes a limit adjusts its
// limiter in place when it can (what keys have used is kept, as SetRate,
// SetBurst and SetLimit keep it); a key that moves to another rule or tier
// starts afresh there. A window limit whose limiter is rebuilt (raised
// past what its counters hold, its Capacity; or given another window)
// carries each key's usage over: for the old window's span, a key's first
// decision charges the new limiter with what the old one says the key
// used (up to the new limit), so a key that used its 5 of 5/h gets 5 more
// at 10/h and none at 5/2h.
type Limiter struct {
	cur atomic.Pointer[table]
	cfg config
	rep report.To // of cfg's observer
	set limiterkit.Settings

	mu      sync.Mutex // serializes changes; never taken to decide
	live    map[string]*live
	file    fileState
	version atomic.Pointer[string] // of the document in force
	refused string                 // the version last rejected by take
}

// live is one limit's limiter across reloads.
type live struct {
	l   throttle.Limiter // nil for a bucket limit served by the throttle.QuotaAllower
	lim Limit
}

// table is one version of the rules, immutable once published.
type table struct {
	deny, allow set[struct{}]
	rules       set[*ruleEntry]
	tiers       map[string]*slot
	def         *slot
	closed      bool
}

// ruleEntry is a rule of a table.
type ruleEntry struct {
	m matcher
	s *slot
}

// slot is one limit as a table sees it.
type slot struct {
	id   string
	tier string // the tier's name, for a tier's limit
	lim  Limit
	l    throttle.Limiter
	qa   throttle.QuotaAllower
}

func (s *slot) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if s.l != nil {
		return s.l.Allow(ctx, key, n)
	}
	return s.qa.AllowQuota(ctx, key, n, s.lim.Rate, s.lim.Burst)
}

// New returns a Limiter enforcing c. Errors wrap throttle.ErrInvalid (bad
// options, a limit the factory rejects) or come from the factory.
func New(c *Config, opts ...Option) (*Limiter, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: rules: nil Config", throttle.ErrInvalid)
	}
	l := &Limiter{}
	if err := optkit.Apply(&l.cfg, "rules", opts); err != nil {
		return nil, err
	}
	var err error
	if l.set, err = limiterkit.NewSettings(l.cfg.limOpts...); err != nil {
		return nil, err
	}
	l.rep = report.New(l.cfg.name, l.cfg.observer)
	if l.cfg.factory == nil {
		l.cfg.factory = l.defaultFactory
	}
	if err := l.Update(c); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Limiter) defaultFactory(_ string, lim Limit) (throttle.Limiter, error) {
	if lim.isWindow() {
		return slidingwindow.New(lim.Count, lim.Window, l.cfg.limOpts...)
	}
	return tokenbucket.New(lim.Rate, lim.Burst, l.cfg.limOpts...)
}

// Update puts the rules of c in force, atomically: a call to Allow sees
// either the old rules or the new ones. If a limit cannot be built or
// changed, nothing changes and the error is returned.
func (l *Limiter) Update(c *Config) error {
	if c == nil {
		return fmt.Errorf("%w: rules: nil Config", throttle.ErrInvalid)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.cur.Load(); t != nil && t.closed {
		return errClosed
	}
	if err := l.apply(c); err != nil {
		return err
	}
	l.version.Store(nil)
	return nil
}

// change is one limit adjusted in place, kept to undo it.
type change struct {
	lv       *live
	old, new Limit
}

// rebuild is one apply in progress: the limiters of the new document,
// and what to undo if it fails.
type rebuild struct {
	l       *Limiter
	next    map[string]*live // id → the limiter of each limit of the new document
	fresh   []*live          // the limiters the factory made for it
	changes []change         // the limits to adjust in place
	carried []*live          // the replaced limiters a carry took over
}

func (l *Limiter) apply(c *Config) error {
	b := &rebuild{l: l, next: make(map[string]*live)}
	t, err := b.table(c)
	if err == nil {
		err = b.adjust()
	}
	if err != nil {
		b.undo()
		return err
	}
	old := l.live
	l.live = b.next
	l.cur.Store(t)
	for id, lv := range old {
		if b.next[id] != lv && !slices.Contains(b.carried, lv) {
			closeLimiter(lv.l)
		}
	}
	return nil
}

// table returns the look-up table of c, with the slots of its limits.
func (b *rebuild) table(c *Config) (*table, error) {
	t := &table{tiers: make(map[string]*slot, len(c.tiers))}
	for _, name := range c.names {
		s, err := b.slot("tier "+quote(name), c.tiers[name])
		if err != nil {
			return nil, err
		}
		s.tier = name
		t.tiers[name] = s
	}
	resolve := func(id string, s spec) (*slot, error) {
		if s.tier != "" {
			return t.tiers[s.tier], nil
		}
		return b.slot(id, s.lim)
	}
	var err error
	if t.def, err = resolve("default", c.def); err != nil {
		return nil, err
	}
	for _, r := range c.rules {
		s, err := resolve(r.m.String(), r.spec)
		if err != nil {
			return nil, err
		}
		t.rules.add(r.m, &ruleEntry{m: r.m, s: s})
	}
	for _, m := range c.allow {
		t.allow.add(m, struct{}{})
	}
	for _, m := range c.deny {
		t.deny.add(m, struct{}{})
	}
	t.rules.seal()
	t.allow.seal()
	t.deny.seal()
	return t, nil
}

// slot returns the slot of limit id: on the throttle.QuotaAllower, on the
// current limiter of id if it can take lim (adjusted later), or on a
// new one from the factory.
func (b *rebuild) slot(id string, lim Limit) (*slot, error) {
	cfg := &b.l.cfg
	if cfg.qa != nil && !lim.isWindow() {
		b.next[id] = &live{lim: lim}
		return &slot{id: id, lim: lim, qa: cfg.qa}, nil
	}
	if cfg.qa != nil && !cfg.custom {
		return nil, invalid("%s: a window limit (%v) needs WithFactory when limits go to a throttle.QuotaAllower", id, lim)
	}
	if old := b.l.live[id]; old != nil && old.l != nil && adjustable(old, lim) {
		if old.lim != lim {
			b.changes = append(b.changes, change{lv: old, old: old.lim, new: lim})
		}
		b.next[id] = old
		return &slot{id: id, lim: lim, l: old.l}, nil
	}
	nl, err := cfg.factory(id, lim)
	if err != nil {
		return nil, fmt.Errorf("rules: %s (%v): %w", id, lim, err)
	}
	if nl == nil {
		return nil, invalid("%s: the factory returned a nil limiter", id)
	}
	if old := b.l.live[id]; old != nil && old.l != nil && old.lim.isWindow() && lim.isWindow() {
		nl = newCarry(nl, old.l, old.lim, lim, b.l.set.Clock) // what keys used is carried over
		b.carried = append(b.carried, old)
	}
	lv := &live{l: nl, lim: lim}
	b.fresh = append(b.fresh, lv)
	b.next[id] = lv
	return &slot{id: id, lim: lim, l: nl}, nil
}

// adjust makes the changes in place. On failure only the changes made
// are left to undo (adjust undid its own partial change).
func (b *rebuild) adjust() error {
	for i := range b.changes {
		ch := &b.changes[i]
		if err := adjust(ch.lv.l, ch.old, ch.new); err != nil {
			b.changes = b.changes[:i]
			return fmt.Errorf("rules: changing %s to %v: %w", idOf(b.next, ch.lv), ch.new, err)
		}
	}
	for _, ch := range b.changes {
		ch.lv.lim = ch.new
	}
	return nil
}

// undo puts the changed limits back and closes the limiters made.
func (b *rebuild) undo() {
	for i := len(b.changes) - 1; i >= 0; i-- {
		_ = adjust(b.changes[i].lv.l, b.changes[i].new, b.changes[i].old)
	}
	for _, lv := range b.fresh {
		closeLimiter(unwrapped(lv.l)) // not what a carry took over: still in force
	}
}

func idOf(m map[string]*live, lv *live) string {
	for id, v := range m {
		if v == lv {
			return id
		}
	}
	return "a limit"
}

func adjustable(old *live, lim Limit) bool {
	if old.lim == lim {
		return true
	}
	switch {
	case !old.lim.isWindow() && !lim.isWindow():
		_, ok := old.l.(rateSetter)
		return ok
	case old.lim.isWindow() && lim.isWindow() && old.lim.Window == lim.Window:
		_, ok := unwrapped(old.l).(limitSetter)
		if c, sized := old.l.(interface{ Capacity() int }); sized && lim.Count > c.Capacity() {
			return false // past what its counters hold: rebuilt
		}
		return ok
	}
	return false
}

// adjust changes l from limit a to b; on failure it leaves l at a.
func adjust(l throttle.Limiter, a, b Limit) error {
	if a == b {
		return nil
	}
	if b.isWindow() {
		return l.(limitSetter).SetLimit(b.Count)
	}
	s := l.(rateSetter)
	// Either order may pass through an invalid mix of old and new (a
	// burst too long at the old rate): try both.
	err := s.SetRate(b.Rate)
	if err == nil {
		if err = s.SetBurst(b.Burst); err == nil {
			return nil
		}
		_ = s.SetRate(a.Rate)
	}
	if err2 := s.SetBurst(b.Burst); err2 != nil {
		return err
	}
	if err2 := s.SetRate(b.Rate); err2 != nil {
		_ = s.SetBurst(a.Burst)
		return err2
	}
	return nil
}

func closeLimiter(l throttle.Limiter) {
	if c, ok := l.(io.Closer); ok {
		_ = c.Close()
	}
}

// route finds what decides key in t: the limit's slot and the rule that
// chose it (nil for a tier or the default), or a nil slot for an
// allow-listed key.
func (l *Limiter) route(t *table, key string) (*slot, *ruleEntry, error) {
	if err := l.set.CheckKey(key); err != nil {
		return nil, nil, err
	}
	if t.closed {
		return nil, nil, errClosed
	}
	if !t.deny.empty() {
		if _, ok := t.deny.lookup(key); ok {
			return nil, nil, errDenied
		}
	}
	if !t.allow.empty() {
		if _, ok := t.allow.lookup(key); ok {
			return nil, nil, nil
		}
	}
	if r, ok := t.rules.lookup(key); ok {
		return r.s, r, nil
	}
	if l.cfg.tierOf != nil {
		if name := l.cfg.tierOf(key); name != "" {
			if s := t.tiers[name]; s != nil {
				return s, nil, nil
			}
			return nil, nil, fmt.Errorf("%w: rules: key's tier %q is not in the rules", throttle.ErrInvalid, name)
		}
	}
	return t.def, nil, nil
}

// Allow asks key's limit for n units; see Limiter for how the limit is
// chosen. An allow-listed key gets Decision{Allowed: true} (Limit 0: no
// limit); a deny-listed one gets an error wrapping throttle.ErrDenied.
func (l *Limiter) Allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	if l.rep.On() {
		return l.rep.Decide(ctx, limiterkit.MethodAllow, key, n, l.allow)
	}
	err = l.decide(ctx, &d, key, n) // d filled in place: see limiterkit.Fill
	return d, err
}

// allow is Allow without the report.
func (l *Limiter) allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	err = l.decide(ctx, &d, key, n)
	return d, err
}

// decide is Allow filling *d.
func (l *Limiter) decide(ctx context.Context, d *throttle.Decision, key string, n int) error {
	for {
		t := l.cur.Load()
		if t == nil {
			return errZero
		}
		s, _, err := l.route(t, key)
		if err != nil {
			return err
		}
		if s == nil {
			if n <= 0 {
				return fmt.Errorf("%w: n must be positive, got %d", throttle.ErrInvalid, n)
			}
			d.Allowed = true
			return nil
		}
		*d, err = s.allow(ctx, key, n)
		if err != nil && l.replaced(t, err) {
			*d = throttle.Decision{}
			continue // a reload closed this limiter under us
		}
		return err
	}
}

// replaced reports whether err comes from a limiter a reload closed after
// t was loaded.
func (l *Limiter) replaced(t *table, err error) bool {
	return errors.Is(err, throttle.ErrClosed) && l.cur.Load() != t
}

// Reserve books n units of key's limit within maxWait. A limit whose
// limiter cannot reserve answers as Allow does: granted now, or not
// granted with the RetryAfter as Delay. An allow-listed key is granted at
// once; a deny-listed one gets an error wrapping throttle.ErrDenied.
func (l *Limiter) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return l.rep.Reserve(ctx, key, n, maxWait, l.reserve)
}

func (l *Limiter) reserve(ctx context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	for {
		t := l.cur.Load()
		if t == nil {
			return throttle.Reservation{}, errZero
		}
		s, _, err := l.route(t, key)
		if err != nil {
			return throttle.Reservation{}, err
		}
		var res throttle.Reservation
		switch r, ok := s.limiter().(throttle.Reserver); {
		case s == nil:
			if n <= 0 {
				return res, fmt.Errorf("%w: n must be positive, got %d", throttle.ErrInvalid, n)
			}
			return limiterkit.NewReservation(0, 0, nil), nil
		case ok:
			res, err = r.Reserve(ctx, key, n, maxWait)
		default:
			var d throttle.Decision
			if d, err = s.allow(ctx, key, n); err == nil {
				if d.Allowed {
					res = limiterkit.NewReservation(0, d.Limit, nil)
				} else {
					res = throttle.Reservation{Delay: d.RetryAfter, Limit: d.Limit}
				}
			}
		}
		if err != nil && l.replaced(t, err) {
			continue
		}
		return res, err
	}
}

func (s *slot) limiter() throttle.Limiter {
	if s == nil {
		return nil
	}
	return s.l
}

// KeyQuota returns the quota of key's limit, and its rate for a bucket
// limit: what the RateLimit fields of httplimit and grpclimit state for
// key. limited is false for a key on the allow list, and for one Allow refuses with an error. It takes no
// lock and does not allocate.
func (l *Limiter) KeyQuota(key string) (q throttle.Quota, refill throttle.Rate, limited bool) {
	t := l.cur.Load()
	if t == nil {
		return q, refill, false
	}
	s, _, err := l.route(t, key)
	if err != nil || s == nil {
		return q, refill, false
	}
	if !s.lim.isWindow() {
		refill = s.lim.Rate
	}
	return s.lim.Quota(), refill, true
}

// Match says which entry of the rules decides a key.
type Match struct {
	// Kind is "deny", "allow", "key", "prefix", "pattern", "tier" (named
	// by WithTierFunc) or "default".
	Kind string
	// Pattern is the key, prefix or pattern of a rule.
	Pattern string
	// Tier is the tier whose limit applies, if any.
	Tier string
	// Limit is the limit applied (zero for "deny" and "allow").
	Limit Limit
}

// Lookup reports which entry of the rules in force decides key, for
// logging and for the RateLimit-Policy header (Limit.Quota). It fails as
// Allow does for a bad key, an unknown tier or a closed Limiter.
func (l *Limiter) Lookup(key string) (Match, error) {
	t := l.cur.Load()
	if t == nil {
		return Match{}, errZero
	}
	s, r, err := l.route(t, key)
	switch {
	case errors.Is(err, errDenied):
		return Match{Kind: "deny"}, nil
	case err != nil:
		return Match{}, err
	case s == nil:
		return Match{Kind: "allow"}, nil
	case r != nil:
		return Match{Kind: kindNames[r.m.kind], Pattern: r.m.s, Tier: s.tier, Limit: s.lim}, nil
	case s == t.def:
		return Match{Kind: "default", Tier: s.tier, Limit: s.lim}, nil
	}
	return Match{Kind: "tier", Tier: s.tier, Limit: s.lim}, nil
}

// Close closes the limiters the rules built (those with a Close method)
// and stops Watch. Later calls to Allow and Reserve fail with an error
// wrapping throttle.ErrClosed. Close is idempotent.
func (l *Limiter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.cur.Load()
	if t == nil || t.closed {
		return nil
	}
	l.cur.Store(&table{closed: true})
	for _, lv := range l.live {
		closeLimiter(lv.l)
	}
	l.live = nil
	return nil
}
