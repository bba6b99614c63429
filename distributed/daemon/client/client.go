// Package client queries a throttled daemon (package daemon) over its
// line protocol, built to fail safe: every query has a short timeout
// (DefaultTimeout, 200 ms), a failure is answered by the failure policy
// (by default it admits the request: fail open; WithPolicy chooses
// refusing, or asking a local limiter), and after 5 consecutive failures
// (WithBackoff) further queries are skipped for a
// backoff that doubles up to a maximum (default one second), so a dead
// daemon costs callers nothing but one timeout now and then, while one
// slow reply among answered ones stops nobody. When a backoff ends, one
// caller probes the daemon while the others keep skipping; the first
// success ends the backoff, so the client answers for real again at most
// one maximum backoff after the daemon comes back.
//
//	c, err := client.New("unix", "/run/throttled.sock")
//	defer c.Close()
//	if ok, err := c.Check(ctx, clientIP); !ok {
//		// throttle: answer 429 (err says why when the daemon failed)
//	}
//
// The timeout must exceed the longest the daemon may take to answer: with
// routing "owner", a query whose owner does not answer is decided on the
// daemon's fallback bucket after its forward_timeout (default 50 ms),
// plus up to its forward_delay (default 5 ms). The defaults leave 145 ms
// for the round trip and scheduling; a shorter WithTimeout, or a longer
// forward_timeout, turns a slow owner into client timeouts, hence into
// the failure policy's answers (with fail-open, admissions).
//
// A daemon at its connection limits closes an idle connection to make
// room for a new one (see the daemon's idle_budget), and idle connections
// time out: a query on a pooled connection the daemon closed is sent
// again on a fresh connection, once, and the caller sees no error. A
// daemon with no idle connection to close answers a new connection "RF"
// and closes it: such a query fails with an error wrapping ErrRefused
// (and throttle.ErrUnavailable), so that a caller can tell "the daemon
// refused me" from "the daemon is down". A refusal is not an outage: it
// is answered by the refused policy (WithRefusedPolicy; by default it
// denies the request, or asks the WithFallback limiter if one is given),
// and it does not count towards the backoff.
//
// Only the daemon's failures count towards the backoff. A tag the daemon
// cannot take (checked before sending against WithMaxTagLen, or refused
// with "ER") is an error of that query alone, wrapping throttle.ErrInvalid;
// a caller's context that ends before the answer fails that caller's query
// alone.
//
// A Client keeps a pool of connections and is safe for concurrent use;
// each query uses one pooled connection. CheckMany pipelines many tags on
// one connection.
package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/breaker"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

var _ throttle.Limiter = (*Client)(nil)

// DefaultTimeout bounds each query unless WithTimeout says otherwise.
const DefaultTimeout = 200 * time.Millisecond

// Defaults of the other options.
const (
	defaultPoolSize   = 16
	defaultMinBackoff = 100 * time.Millisecond
	defaultMaxBackoff = time.Second
	// defaultFailures is how many consecutive failed queries start a
	// backoff.
	defaultFailures = 5
	// maxTagLen is the longest tag the client sends by default: the
	// daemon's default max_tag_len. Longer tags are refused before
	// sending (see WithMaxTagLen).
	maxTagLen = 256
	// hardMaxTagLen is the daemon's largest max_tag_len, and the most
	// WithMaxTagLen accepts.
	hardMaxTagLen = 1024
)

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each query (dial, write and read); default
// DefaultTimeout. A context deadline, if sooner, wins.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithPoolSize sets how many idle connections are kept (default
// 16). Busier callers open more; the extra ones are closed
// after use.
func WithPoolSize(n int) Option { return func(c *Client) { c.poolSize = n } }

// WithBackoff sets how many consecutive failed queries start a backoff
// (default 5; 1 backs off at the first failure), and the first and the
// longest pause of queries then (defaults 100 ms and 1 s). Any answered
// query resets the count, so a slow reply now and then does not stop the
// other callers.
func WithBackoff(failures int, minPause, maxPause time.Duration) Option {
	return func(c *Client) { c.failures, c.minBackoff, c.maxBackoff = failures, minPause, maxPause }
}

// WithMaxTagLen sets the longest tag the client sends: set it to the
// daemon's max_tag_len when that is not the default (256). Longer
// tags are refused without a query, with an error wrapping
// throttle.ErrInvalid. At most 1024, the daemon's largest max_tag_len.
func WithMaxTagLen(n int) Option { return func(c *Client) { c.maxTagLen = n } }

// WithPolicy sets what a failed query answers (default failsafe.Open:
// admit). failsafe.Closed denies, and failsafe.Fallback asks the limiter
// given with WithFallback.
func WithPolicy(p failsafe.Policy) Option { return func(c *Client) { c.policy = p } }

// WithFallback sets the local limiter that answers failed queries, and
// selects failsafe.Fallback. A good one is the daemon's limit divided by
// the number of processes sharing it.
func WithFallback(l throttle.Limiter) Option {
	return func(c *Client) { c.fallback, c.policy, c.refused = l, failsafe.Fallback, failsafe.Fallback }
}

// WithRefusedPolicy sets what a query the daemon refused answers
// (default failsafe.Closed: deny). The daemon refuses a connection at its
// connection limits (max_conns, or max_conns_per_addr for this client's
// address or process, with no idle connection to close for it): it is up
// and said no, which is not an outage, so by default the query is denied
// rather than admitted, and refusals do not start a backoff. failsafe.Open
// admits, and failsafe.Fallback asks the limiter of WithFallback (which
// selects it, unless this option comes after).
func WithRefusedPolicy(p failsafe.Policy) Option { return func(c *Client) { c.refused = p } }

// ErrRefused is wrapped by the error of a query the daemon refused
// because it was at its connection limits (max_conns, or
// max_conns_per_addr for this client's address or process). It wraps
// throttle.ErrUnavailable.
var ErrRefused = fmt.Errorf("%w: daemon refused the connection (max_conns or max_conns_per_addr reached)", throttle.ErrUnavailable)

// WithDialer replaces the dialer (for tests, or custom sockets).
func WithDialer(d func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(c *Client) { c.dial = d }
}

// Client queries one daemon. Create it with New; it is safe for concurrent
// use. The zero value is not usable.
type Client struct {
	network, addr          string
	timeout                time.Duration
	poolSize               int
	minBackoff, maxBackoff time.Duration
	failures               int
	policy                 failsafe.Policy
	refused                failsafe.Policy // what a refused query answers
	fallback               throttle.Limiter
	maxTagLen              int
	dial                   func(ctx context.Context, network, addr string) (net.Conn, error)

	pool   chan *conn
	closed atomic.Bool

	br breaker.Breaker // the backoff: opens after consecutive failures

	st struct{ queries, allowed, failures, refused, skipped, dials atomic.Uint64 }
}

type conn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// Stats counts what a Client did.
type Stats struct {
	Queries  uint64 // answered by the daemon
	Allowed  uint64 // of which "OK"
	Failures uint64 // queries that failed (timeout, refused, ...)
	Refused  uint64 // of which refused by the daemon at its connection limits
	Skipped  uint64 // queries not sent because of a backoff
	Dials    uint64 // connections opened
}

// New returns a client of the daemon at addr on network ("tcp" or
// "unix"). It connects lazily. Errors wrap throttle.ErrInvalid.
func New(network, addr string, opts ...Option) (*Client, error) {
	c := &Client{network: network, addr: addr, timeout: DefaultTimeout, poolSize: defaultPoolSize,
		minBackoff: defaultMinBackoff, maxBackoff: defaultMaxBackoff, failures: defaultFailures,
		policy: failsafe.Open, maxTagLen: maxTagLen}
	var d net.Dialer
	c.dial = d.DialContext
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", throttle.ErrInvalid)
		}
		o(c)
	}
	switch {
	case network != "tcp" && network != "tcp4" && network != "tcp6" && network != "unix":
		return nil, fmt.Errorf("%w: network %q: want tcp or unix", throttle.ErrInvalid, network)
	case addr == "":
		return nil, fmt.Errorf("%w: empty address", throttle.ErrInvalid)
	case c.timeout <= 0:
		return nil, fmt.Errorf("%w: timeout must be positive", throttle.ErrInvalid)
	case c.poolSize < 0:
		return nil, fmt.Errorf("%w: pool size must not be negative", throttle.ErrInvalid)
	case c.minBackoff < 0 || c.maxBackoff < c.minBackoff:
		return nil, fmt.Errorf("%w: backoff must satisfy 0 <= min <= max", throttle.ErrInvalid)
	case c.failures < 1:
		return nil, fmt.Errorf("%w: failures %d: must be at least 1", throttle.ErrInvalid, c.failures)
	case c.policy < failsafe.Closed || c.policy > failsafe.Fallback || c.refused < failsafe.Closed || c.refused > failsafe.Fallback:
		return nil, fmt.Errorf("%w: unknown policy %v or refused policy %v", throttle.ErrInvalid, c.policy, c.refused)
	case (c.policy == failsafe.Fallback || c.refused == failsafe.Fallback) && c.fallback == nil:
		return nil, fmt.Errorf("%w: policy Fallback needs WithFallback", throttle.ErrInvalid)
	case c.maxTagLen < 1 || c.maxTagLen > hardMaxTagLen:
		return nil, fmt.Errorf("%w: max tag length %d out of [1, %d]", throttle.ErrInvalid, c.maxTagLen, hardMaxTagLen)
	case c.dial == nil:
		return nil, fmt.Errorf("%w: nil dialer", throttle.ErrInvalid)
	}
	if c.minBackoff > 0 {
		c.br.Init(c.failures, c.minBackoff, c.maxBackoff) // valid: checked above
	}
	c.pool = make(chan *conn, c.poolSize)
	return c, nil
}

// checkTag refuses tags the protocol cannot carry or the daemon would
// answer "ER".
func (c *Client) checkTag(tag string) error {
	if tag == "" || len(tag) > c.maxTagLen || strings.ContainsAny(tag, "\r\n") {
		return fmt.Errorf("%w: tag of %d bytes: must have 1 to %d bytes and no CR or LF", throttle.ErrInvalid, len(tag), c.maxTagLen)
	}
	return nil
}

// rejectedError is the daemon's "ER" reply to the query of tag.
type rejectedError struct{ tag string }

func (e *rejectedError) Error() string {
	t := e.tag
	if len(t) > 40 {
		t = t[:40] + "..."
	}
	return fmt.Sprintf("daemon rejected tag %q (ER): longer than its max_tag_len?", t)
}

func (e *rejectedError) Unwrap() error { return throttle.ErrInvalid }

// Check asks whether a request tagged tag should be served. On failure
// (daemon down, slow, or backing off) it returns the policy's answer
// (true with failsafe.Open, false with Closed, the fallback's with
// Fallback), or if the daemon refused the connection the refused
// policy's (see WithRefusedPolicy), and an error wrapping throttle.ErrUnavailable,
// which callers that fail open may ignore. A tag the protocol cannot
// carry, or that the daemon rejects, returns false and an error wrapping
// throttle.ErrInvalid. If ctx ends before the answer, the error wraps
// both throttle.ErrUnavailable and ctx.Err(), and other callers are not
// affected.
func (c *Client) Check(ctx context.Context, tag string) (bool, error) {
	if err := c.checkTag(tag); err != nil {
		return false, err
	}
	var out [1]bool
	err := c.query(ctx, []string{tag}, out[:], true)
	if err != nil {
		return out[0], err
	}
	return out[0], nil
}

// CheckMany asks about every tag in tags, pipelined on one connection,
// and stores the answers in out (len(out) must be len(tags)). On failure
// every answer is the policy's and the error wraps
// throttle.ErrUnavailable. If the daemon rejects a tag, its answer is
// false and the error wraps throttle.ErrInvalid; the other answers stand
// if the daemon gave them.
func (c *Client) CheckMany(ctx context.Context, tags []string, out []bool) error {
	if len(out) != len(tags) {
		return fmt.Errorf("%w: len(out) %d != len(tags) %d", throttle.ErrInvalid, len(out), len(tags))
	}
	for _, t := range tags {
		if err := c.checkTag(t); err != nil {
			return err
		}
	}
	return c.query(ctx, tags, out, true)
}

// Allow implements throttle.Limiter: one query for key. n must be 1 (the
// protocol charges one token per query). When the daemon fails, the
// policy decides with a nil error (see Stats for the failures): Open
// admits, Fallback returns the fallback's decision; with Closed the
// error wraps throttle.ErrUnavailable.
func (c *Client) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if err := limiterkit.CheckN(n, 1); err != nil {
		return throttle.Decision{}, err
	}
	if err := c.checkTag(key); err != nil {
		return throttle.Decision{}, err
	}
	var out [1]bool
	err := c.query(ctx, []string{key}, out[:], false)
	ok := out[0]
	policy := c.policy
	if errors.Is(err, ErrRefused) {
		policy = c.refused
	}
	switch {
	case errors.Is(err, throttle.ErrUnavailable) && policy == failsafe.Open:
		return throttle.Decision{Allowed: true, Limit: 1}, nil
	case errors.Is(err, throttle.ErrUnavailable) && policy == failsafe.Fallback:
		return c.fallback.Allow(ctx, key, 1)
	case err != nil:
		return throttle.Decision{}, err
	case ok:
		return throttle.Decision{Allowed: true, Limit: 1}, nil
	default:
		// The protocol does not say when to retry; one second is a hint.
		return throttle.Decision{Limit: 1, RetryAfter: time.Second, ResetAfter: time.Second}, nil
	}
}

// query asks the daemon about tags. On failure, the policy answers in
// out if decide (Allow asks a fallback itself, for its Decision).
func (c *Client) query(ctx context.Context, tags []string, out []bool, decide bool) error {
	fail := func(err error) error {
		if decide {
			p := c.policy
			if errors.Is(err, ErrRefused) {
				p = c.refused
			}
			c.decideFailed(ctx, p, tags, out)
		}
		return err
	}
	if c.closed.Load() {
		return fail(fmt.Errorf("client closed: %w", throttle.ErrUnavailable))
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("%w: %w", throttle.ErrUnavailable, err))
	}
	now := time.Now()
	probe, ok := c.admit(now)
	if !ok {
		c.st.skipped.Add(1)
		return fail(fmt.Errorf("daemon %s failed recently, backing off: %w", c.addr, throttle.ErrUnavailable))
	}
	deadline := now.Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	cn, err := c.call(ctx, deadline, tags, out)
	var rej *rejectedError
	if errors.As(err, &rej) {
		// The daemon answered: not a failure. It closes the connection
		// after an oversized line, so do not reuse it.
		cn.c.Close()
		c.succeeded(probe)
		return err
	}
	if err != nil {
		if cn != nil {
			cn.c.Close()
		}
		return fail(c.failure(ctx, probe, deadline, err))
	}
	c.put(cn)
	c.succeeded(probe)
	c.st.queries.Add(uint64(len(tags)))
	return nil
}

// call sends tags to the daemon and reads its answers into out, on a
// pooled connection or a new one, and once more on a new one if a pooled
// connection failed with time left: the daemon may have closed it while
// idle (it restarted, timed it out, or gave its place to a new one at a
// cap). cn is the connection last used, nil if none was.
func (c *Client) call(ctx context.Context, deadline time.Time, tags []string, out []bool) (cn *conn, err error) {
	cn, pooled, err := c.get(ctx, deadline)
	if err != nil {
		return cn, err
	}
	err = c.roundTrip(cn, deadline, tags, out)
	var rej *rejectedError
	if err != nil && !errors.As(err, &rej) && !errors.Is(err, ErrRefused) && pooled && time.Now().Before(deadline) && ctx.Err() == nil {
		cn.c.Close()
		if cn, _, err = c.dialConn(ctx, deadline); err == nil {
			err = c.roundTrip(cn, deadline, tags, out)
		}
	}
	return cn, err
}

// failure records err, a failed exchange, in the breaker (a failure of the
// daemon's unless the caller's context ended first) and returns the error
// the query fails with.
func (c *Client) failure(ctx context.Context, probe bool, deadline time.Time, err error) error {
	if cerr := ctx.Err(); cerr != nil || callerDeadline(ctx, deadline) {
		// The caller's context ended first: that says nothing about
		// the daemon.
		if cerr == nil {
			cerr = context.DeadlineExceeded
		}
		c.released(probe)
		return fmt.Errorf("daemon %s: %v: %w: %w", c.addr, err, throttle.ErrUnavailable, cerr)
	}
	if errors.Is(err, ErrRefused) {
		// The daemon is up and said no: not a failure of the daemon's,
		// no backoff (its skipped queries would answer as in an outage).
		c.st.failures.Add(1)
		c.st.refused.Add(1)
		c.released(probe)
		return fmt.Errorf("daemon %s: %w", c.addr, err)
	}
	c.failed(probe)
	return fmt.Errorf("daemon %s: %v: %w", c.addr, err, throttle.ErrUnavailable)
}

// decideFailed stores policy p's answers to tags in out.
func (c *Client) decideFailed(ctx context.Context, p failsafe.Policy, tags []string, out []bool) {
	for i := range out {
		switch p {
		case failsafe.Open:
			out[i] = true
		case failsafe.Fallback:
			d, err := c.fallback.Allow(ctx, tags[i], 1)
			out[i] = err == nil && d.Allowed
		default:
			out[i] = false
		}
	}
}

// callerDeadline reports whether deadline is ctx's and has passed.
func callerDeadline(ctx context.Context, deadline time.Time) bool {
	d, ok := ctx.Deadline()
	return ok && d.Equal(deadline) && !time.Now().Before(d)
}

// admit reports whether a query may go to the daemon now, and whether it
// is the one probe allowed once a backoff has run out.
func (c *Client) admit(now time.Time) (probe, ok bool) { return c.br.Allow(now.UnixNano()) }

// succeeded ends any backoff.
func (c *Client) succeeded(probe bool) { c.br.Success(probe) }

// released ends a probe that learned nothing (the caller gave up).
func (c *Client) released(probe bool) { c.br.Release(probe) }

func (c *Client) roundTrip(cn *conn, deadline time.Time, tags []string, out []bool) error {
	if err := cn.c.SetDeadline(deadline); err != nil {
		return err
	}
	// Pipeline in chunks, so that neither side's socket buffers can fill
	// up with unread replies while the other is still writing.
	const chunk = 1024
	var rejected error
	for len(tags) > 0 {
		k := min(chunk, len(tags))
		err := c.exchange(cn, tags[:k], out[:k])
		var rej *rejectedError
		switch {
		case errors.As(err, &rej):
			rejected = err
		case err != nil && rejected != nil:
			// The daemon closes the connection after an oversized line:
			// the rejection is the news, not the failure; the rest are
			// unanswered.
			c.decideFailed(context.Background(), c.policy, tags, out)
			return rejected
		case err != nil:
			return err
		}
		tags, out = tags[k:], out[k:]
	}
	return rejected
}

// exchange sends tags and reads their answers. A rejected tag ("ER")
// gets false, the others their answers, and the error is the first
// rejection.
func (c *Client) exchange(cn *conn, tags []string, out []bool) error {
	var rejected error
	for _, t := range tags {
		cn.w.WriteString(t)
		cn.w.WriteByte('\n')
	}
	if err := cn.w.Flush(); err != nil {
		return err
	}
	var reply [3]byte
	for i := range tags {
		if _, err := io.ReadFull(cn.r, reply[:]); err != nil {
			if rejected != nil {
				// The daemon closed the connection after an oversized
				// line: the rest are unanswered.
				c.decideFailed(context.Background(), c.policy, tags[i:], out[i:])
				return rejected
			}
			return err
		}
		switch string(reply[:]) {
		case "OK\n":
			out[i] = true
			c.st.allowed.Add(1)
		case "NO\n":
			out[i] = false
		case "ER\n":
			out[i] = false
			if rejected == nil {
				rejected = &rejectedError{tag: tags[i]}
			}
		case "RF\n": // the daemon refused the connection
			return ErrRefused
		default:
			return fmt.Errorf("unexpected reply %q", reply[:])
		}
	}
	return rejected
}

// failed starts or lengthens the backoff: the minimum, doubled after each
// failed probe up to the maximum.
func (c *Client) failed(probe bool) {
	c.st.failures.Add(1)
	c.br.Failure(time.Now().UnixNano(), probe)
}

func (c *Client) get(ctx context.Context, deadline time.Time) (*conn, bool, error) {
	select {
	case cn := <-c.pool:
		return cn, true, nil
	default:
	}
	return c.dialConn(ctx, deadline)
}

func (c *Client) dialConn(ctx context.Context, deadline time.Time) (*conn, bool, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	nc, err := c.dial(dctx, c.network, c.addr)
	if err != nil {
		return nil, false, err
	}
	c.st.dials.Add(1)
	return &conn{c: nc, r: bufio.NewReaderSize(nc, 512), w: bufio.NewWriterSize(nc, 4096)}, false, nil
}

func (c *Client) put(cn *conn) {
	if c.closed.Load() {
		cn.c.Close()
		return
	}
	select {
	case c.pool <- cn:
	default:
		cn.c.Close()
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{Queries: c.st.queries.Load(), Allowed: c.st.allowed.Load(), Failures: c.st.failures.Load(), Refused: c.st.refused.Load(),
		Skipped: c.st.skipped.Load(), Dials: c.st.dials.Load()}
}

// Close closes the pooled connections. Later queries fail safe (fail
// open unless WithPolicy(failsafe.Closed)). Idempotent.
func (c *Client) Close() error {
	c.closed.Store(true)
	for {
		select {
		case cn := <-c.pool:
			cn.c.Close()
		default:
			return nil
		}
	}
}
