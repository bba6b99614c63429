// Package etcdelection elects the master of a level of capacity servers
// on etcd, implementing capacity.Election.
//
//	e, err := etcdelection.New(etcdClient, "/throttle/capacity/root")
//	err = e.Campaign(ctx, "10.0.0.1:7000", func(l capacity.Leadership) {
//		// l.IsMaster: serve (learning first); l.Master: redirect there
//	})
//
// Every replica holds an etcd lease (a concurrency.Session) and puts a key
// under a common prefix, attached to that lease, whose value is the
// replica's address. The replica whose key was created first is the
// master; the creation revision of its key is the Term, so terms grow
// with every change of master and serve as fencing tokens. The other
// replicas report the master's address, for clients and child servers to
// follow.
//
// A master stays master only while it knows that its lease is alive at
// etcd. It renews the lease itself (besides the session's keep-alive
// stream) and times every renewal: a renewal sent at time s and answered
// with a TTL of d keeps the lease alive at etcd until at least s+d. When
// renewals fail (etcd down, paused or out of reach) they are retried,
// and the master steps down a margin before that bound, so that it has
// stopped acting as the master before etcd can expire its lease and elect
// another. If renewals succeed again while the lease is still alive and
// its key still there, it is the master again in the same term. A master
// whose key is deleted steps down at once; when its lease is gone it
// campaigns again with a new one.
package etcdelection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Defaults of the options.
const (
	// DefaultTTL is the lease TTL: a master that dies without resigning
	// is replaced within about this long.
	DefaultTTL = 10 * time.Second
)

// Election is a capacity.Election on etcd. Its Campaign method may be
// called concurrently, by several replicas of one process (each with its
// own address) as well as by one.
type Election struct {
	client *clientv3.Client
	prefix string // ends with "/"
	ttl    time.Duration
	margin time.Duration
	renew  time.Duration // between renewals
	retry  time.Duration // between failed tries

	// onRenew, when set (by tests), is told every new lower bound of the
	// lease's expiry at etcd.
	onRenew func(lease clientv3.LeaseID, validUntil time.Time)
}

var _ capacity.Election = (*Election)(nil)

// Option configures an Election.
type Option func(*options)

type options struct {
	ttl    time.Duration
	margin time.Duration // 0: ttl/5
}

// WithTTL sets the TTL of each replica's lease, a whole number of seconds
// of at least one second (default DefaultTTL). etcd may raise a very short
// TTL to its own minimum (about 2s with default settings); the election
// then uses the TTL etcd granted.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithMargin sets how long before the earliest moment its lease can
// expire at etcd a master that cannot renew it steps down (default a fifth
// of the TTL). It must be positive and below half the TTL.
func WithMargin(margin time.Duration) Option { return func(o *options) { o.margin = margin } }

// New returns an election among the replicas that use prefix (a non-empty
// etcd key prefix such as "/throttle/capacity/root") on client. The
// caller keeps ownership of client and closes it after every Campaign has
// returned. Bad options give an error wrapping throttle.ErrInvalid.
func New(client *clientv3.Client, prefix string, opts ...Option) (*Election, error) {
	o := options{ttl: DefaultTTL}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("etcdelection: nil client: %w", throttle.ErrInvalid)
	case strings.Trim(prefix, "/") == "":
		return nil, fmt.Errorf("etcdelection: empty prefix %q: %w", prefix, throttle.ErrInvalid)
	case o.ttl < time.Second || o.ttl%time.Second != 0:
		return nil, fmt.Errorf("etcdelection: TTL %v is not a whole number of seconds >= 1s: %w", o.ttl, throttle.ErrInvalid)
	}
	if o.margin == 0 {
		o.margin = o.ttl / 5
	}
	if o.margin <= 0 || o.margin >= o.ttl/2 {
		return nil, fmt.Errorf("etcdelection: margin %v not in (0, TTL/2 = %v): %w", o.margin, o.ttl/2, throttle.ErrInvalid)
	}
	return &Election{
		client: client,
		prefix: strings.TrimSuffix(prefix, "/") + "/",
		ttl:    o.ttl,
		margin: o.margin,
		renew:  o.ttl / 6,
		retry:  max(o.ttl/20, 50*time.Millisecond),
	}, nil
}

// errLost ends a round: the lease or the master key is gone.
var errLost = errors.New("etcdelection: lease or key lost")

// Campaign takes part in the election under address until ctx is done,
// calling report on every change of leadership, never concurrently, from
// its own goroutine: report must return quickly, as renewals wait for it.
// While etcd cannot be reached it keeps trying. Before it returns it gives
// up mastership (reporting so) and revokes its lease, so that another
// replica is elected at once. It returns ctx's error, or an error wrapping
// throttle.ErrInvalid for an empty address.
func (e *Election) Campaign(ctx context.Context, address string, report func(capacity.Leadership)) error {
	if address == "" {
		return fmt.Errorf("etcdelection: empty address: %w", throttle.ErrInvalid)
	}
	rep := &reporter{report: report}
	for {
		err := e.round(ctx, address, rep)
		if ctx.Err() != nil {
			rep.set(capacity.Leadership{Term: rep.last.Term})
			return ctx.Err()
		}
		_ = err // the round failed: etcd unreachable or the lease lost; try again
		if rep.last.IsMaster {
			rep.set(capacity.Leadership{Term: rep.last.Term})
		}
		select {
		case <-ctx.Done():
		case <-time.After(e.retry):
		}
	}
}

// reporter calls report when the leadership changes.
type reporter struct {
	report func(capacity.Leadership)
	last   capacity.Leadership
	any    bool
}

func (r *reporter) set(l capacity.Leadership) {
	if r.any && l == r.last {
		return
	}
	r.last, r.any = l, true
	r.report(l)
}

type renewal struct {
	sent time.Time
	ttl  time.Duration
	err  error
}

type elected struct {
	rev, hdrRev int64
	err         error
}

// round campaigns with one lease until it is lost, etcd fails the
// campaign, or ctx is done.
func (e *Election) round(ctx context.Context, address string, rep *reporter) error {
	r, err := e.grant(ctx, address, rep)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	defer r.end(ctx, stop)
	if err := r.start(rctx); err != nil {
		return err
	}
	for {
		r.report()
		if err := r.next(rctx); err != nil {
			return err
		}
	}
}

// round is the state of one round: one lease, its campaign, and what the
// replica knows of its standing.
type round struct {
	e       *Election
	address string
	rep     *reporter

	lease      clientv3.LeaseID
	key        string        // the replica's key under the prefix
	ttl        time.Duration // the TTL etcd granted
	margin     time.Duration // the step-down margin, scaled to ttl
	validUntil time.Time     // the lease is alive at etcd at least until then
	timer      *time.Timer   // fires a margin before validUntil

	election  *concurrency.Election
	observed  <-chan clientv3.GetResponse // nil while a restart is pending
	reobserve <-chan time.Time            // restarts a failed observer
	renewals  chan renewal
	won       chan elected
	done      chan struct{} // closed when the round's goroutines are done

	isElected bool
	term      int64
	keyEvents clientv3.WatchChan
}

// grant takes a lease for a new round, timing its TTL from when it asked.
func (e *Election) grant(ctx context.Context, address string, rep *reporter) (*round, error) {
	sent := time.Now()
	gctx, cancel := context.WithTimeout(ctx, e.ttl)
	g, err := e.client.Grant(gctx, int64(e.ttl/time.Second))
	cancel()
	if err != nil {
		return nil, err
	}
	r := &round{
		e: e, address: address, rep: rep,
		lease: g.ID, key: fmt.Sprintf("%s%x", e.prefix, int64(g.ID)),
		ttl: time.Duration(g.TTL) * time.Second, margin: e.margin,
		renewals: make(chan renewal), won: make(chan elected, 1), done: make(chan struct{}),
	}
	if r.ttl > e.ttl { // etcd raised the TTL to its minimum
		r.margin = e.margin * r.ttl / e.ttl
	}
	r.validUntil = sent.Add(r.ttl)
	r.timer = time.NewTimer(time.Until(r.validUntil.Add(-r.margin)))
	return r, nil
}

// start opens the round's session and observer, and starts its campaign
// and renewals.
func (r *round) start(ctx context.Context) error {
	sess, err := concurrency.NewSession(r.e.client, concurrency.WithLease(r.lease), concurrency.WithContext(ctx))
	if err != nil {
		close(r.done)
		return err
	}
	r.election = concurrency.NewElection(sess, strings.TrimSuffix(r.e.prefix, "/"))
	r.observed = r.election.Observe(ctx)
	go func() {
		defer close(r.done)
		wonDone := make(chan struct{})
		go func() {
			defer close(wonDone)
			rev, hdr, err := r.e.campaign(ctx, r.address, r.lease)
			r.won <- elected{rev, hdr, err}
		}()
		r.e.renewLoop(ctx, r.lease, r.renewals)
		<-wonDone
		<-sess.Done()
	}()
	return nil
}

// end steps down, stops the round's goroutines and revokes its lease.
func (r *round) end(ctx context.Context, stop context.CancelFunc) {
	r.timer.Stop()
	// Step down before anything else: once the lease is revoked another
	// replica may be elected at once.
	if r.rep.last.IsMaster {
		r.rep.set(capacity.Leadership{Term: r.rep.last.Term})
	}
	stop()
	<-r.done
	// Wait for the observer to end. It is nil when it had failed and its
	// restart was pending: ranging over nil would block for ever, as it
	// did when the caller's cancellation closed the observer just before
	// the round saw it.
	if r.observed != nil {
		for range r.observed {
		}
	}
	// Revoking deletes the key: the next replica is elected at once. If
	// etcd cannot be reached the lease expires by itself.
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(r.ttl, 2*time.Second))
	_, _ = r.e.client.Revoke(vctx, r.lease)
	cancel()
}

// report reports the master's standing: elected, key present, lease
// surely alive.
func (r *round) report() {
	if !r.isElected {
		return
	}
	if time.Now().Before(r.validUntil.Add(-r.margin)) {
		r.rep.set(capacity.Leadership{Master: r.address, IsMaster: true, Term: r.term})
	} else {
		r.rep.set(capacity.Leadership{Term: r.term})
	}
}

// next waits for the next event of the round and takes it in; an error
// ends the round.
func (r *round) next(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case rn := <-r.renewals:
		return r.renewed(rn)
	case w := <-r.won:
		if w.err != nil {
			return w.err
		}
		r.isElected, r.term = true, w.rev
		r.keyEvents = r.e.client.Watch(ctx, r.key, clientv3.WithRev(w.hdrRev+1))
	case wr, ok := <-r.keyEvents:
		return r.keyChanged(wr, ok)
	case o, ok := <-r.observed:
		r.observe(o, ok)
	case <-r.reobserve:
		r.observed, r.reobserve = r.election.Observe(ctx), nil
	case <-r.timer.C:
	}
	return nil
}

// renewed takes in a renewal: a lease etcd no longer has ends the round;
// a success moves the bound of the lease's life.
func (r *round) renewed(rn renewal) error {
	if errors.Is(rn.err, rpctypes.ErrLeaseNotFound) {
		return errLost
	}
	if rn.err == nil && rn.sent.Add(rn.ttl).After(r.validUntil) {
		r.validUntil = rn.sent.Add(rn.ttl)
		r.timer.Reset(time.Until(r.validUntil.Add(-r.margin)))
		if r.e.onRenew != nil {
			r.e.onRenew(r.lease, r.validUntil)
		}
	}
	return nil
}

// keyChanged takes in the watch of the master's own key: its deletion,
// or a watch that failed, ends the round.
func (r *round) keyChanged(wr clientv3.WatchResponse, ok bool) error {
	if !ok || wr.Err() != nil {
		return errLost // cannot tell whether the key is still there
	}
	for _, ev := range wr.Events {
		if ev.Type == mvccpb.DELETE {
			r.rep.set(capacity.Leadership{Term: r.term}) // step down at once
			return errLost
		}
	}
	return nil
}

// observe takes in who the master is, as a replica not elected sees it;
// a failed observer is restarted a little later.
func (r *round) observe(o clientv3.GetResponse, ok bool) {
	if !ok { // etcd failed it: observe again a little later
		r.observed, r.reobserve = nil, time.After(r.e.retry)
		return
	}
	if !r.isElected && len(o.Kvs) > 0 && string(o.Kvs[0].Key) != r.key {
		r.rep.set(capacity.Leadership{Master: string(o.Kvs[0].Value), Term: o.Kvs[0].CreateRevision})
	}
}

// renewLoop renews the lease every e.renew (every e.retry after a
// failure) and sends each outcome to out, until the lease is gone or ctx
// is done.
func (e *Election) renewLoop(ctx context.Context, id clientv3.LeaseID, out chan<- renewal) {
	for {
		sent := time.Now()
		kctx, cancel := context.WithTimeout(ctx, e.renew)
		resp, err := e.client.KeepAliveOnce(kctx, id)
		cancel()
		r := renewal{sent: sent, err: err}
		if err == nil {
			r.ttl = time.Duration(resp.TTL) * time.Second
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return
		}
		next := e.renew
		if err != nil {
			next = e.retry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(sent.Add(next))):
		}
	}
}

// campaign puts this replica's key under the prefix and waits until no
// key created before it remains. It returns the key's creation revision
// and the revision from which to watch it.
func (e *Election) campaign(ctx context.Context, address string, id clientv3.LeaseID) (rev, hdrRev int64, err error) {
	key := fmt.Sprintf("%s%x", e.prefix, int64(id))
	resp, err := e.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, address, clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return 0, 0, err
	}
	if !resp.Succeeded {
		return 0, 0, fmt.Errorf("etcdelection: key %s exists", key)
	}
	rev, hdrRev = resp.Header.Revision, resp.Header.Revision
	for {
		opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))
		g, err := e.client.Get(ctx, e.prefix, opts...)
		if err != nil {
			return 0, 0, err
		}
		if len(g.Kvs) == 0 {
			return rev, hdrRev, nil
		}
		if err := e.waitDelete(ctx, string(g.Kvs[0].Key), g.Header.Revision); err != nil {
			return 0, 0, err
		}
	}
}

// waitDelete waits until key is deleted after revision rev.
func (e *Election) waitDelete(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range e.client.Watch(wctx, key, clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("etcdelection: watch closed")
}
