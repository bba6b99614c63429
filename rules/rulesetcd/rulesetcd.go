// Package rulesetcd delivers a rules document (see package rules) from an
// etcd key, and follows its changes with an etcd watch.
//
//	src := rules.Cached(rulesetcd.New(client, "/config/rules"), cachePath)
//	l, err := rules.OpenSource(ctx, src, 5*time.Second)
//	...
//	go l.Follow(ctx, src, 0) // the cached source: each good document refreshes the file
//
// A Document's Version is the key's modification revision. A missing key
// is an error wrapping throttle.ErrInvalid, an unreachable etcd one
// wrapping throttle.ErrUnavailable: either way the rules in force stay.
// While etcd is unreachable the watch waits for it, and on its return
// catches up from the last revision it saw.
package rulesetcd

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ rules.Watcher = (*Source)(nil)

// Source is the rules document stored at one etcd key. It is safe for
// concurrent use; make it with New.
type Source struct {
	client *clientv3.Client
	key    string
	retry  time.Duration
	check  time.Duration
}

// Option configures New.
type Option func(*Source)

// WithRetry sets how long Watch waits before it tries again after etcd
// failed it (a compacted revision, a lost leader); the default is 1s, and
// d <= 0 keeps it. It is also the deadline of Watch's reads.
func WithRetry(d time.Duration) Option {
	return func(s *Source) {
		if d > 0 {
			s.retry = d
		}
	}
}

// WithCheckInterval sets how often Watch, while nothing changes, checks
// that etcd still answers (a watch alone does not notice that etcd is
// gone: the client waits for it), so that an outage is reported to the
// Limiter; the default is 10s, and d <= 0 keeps it.
func WithCheckInterval(d time.Duration) Option {
	return func(s *Source) {
		if d > 0 {
			s.check = d
		}
	}
}

// New returns the document at key, read with client (which the caller
// keeps and closes).
func New(client *clientv3.Client, key string, opts ...Option) *Source {
	s := &Source{client: client, key: key, retry: time.Second, check: 10 * time.Second}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Fetch reads the key.
func (s *Source) Fetch(ctx context.Context) (rules.Document, error) {
	d, _, err := s.get(ctx)
	return d, err
}

// get reads the key, and returns the store's revision of the read.
func (s *Source) get(ctx context.Context) (rules.Document, int64, error) {
	if s == nil || s.client == nil {
		return rules.Document{}, 0, fmt.Errorf("%w: rulesetcd: use New with a client", throttle.ErrInvalid)
	}
	resp, err := s.client.Get(ctx, s.key)
	if err != nil {
		return rules.Document{}, 0, fmt.Errorf("rulesetcd: get %q: %w: %w", s.key, throttle.ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 {
		return rules.Document{}, resp.Header.Revision, s.missing()
	}
	kv := resp.Kvs[0]
	return doc(kv.Value, kv.ModRevision), resp.Header.Revision, nil
}

func (s *Source) missing() error {
	return fmt.Errorf("%w: rulesetcd: no document at key %q", throttle.ErrInvalid, s.key)
}

func doc(data []byte, rev int64) rules.Document {
	return rules.Document{Data: data, Version: "etcd:" + strconv.FormatInt(rev, 10)}
}

// Watch calls f with the key's document, then with each change of it
// (a deletion is an error), until ctx is done; it returns ctx's error.
// When etcd cannot be read or ends the watch, f is told and Watch tries
// again after the retry interval; while etcd does not answer the checks
// (see WithCheckInterval), f is told at each one, and the watch catches
// up from the last revision it saw once etcd is back.
func (s *Source) Watch(ctx context.Context, f func(rules.Document, error)) error {
	for {
		if err := s.watchOnce(ctx, f); ctx.Err() == nil {
			f(rules.Document{}, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.retry):
		}
	}
}

// watchOnce reads the key, then follows it from the revision read until
// the watch fails.
func (s *Source) watchOnce(ctx context.Context, f func(rules.Document, error)) error {
	d, rev, err := s.getWithin(ctx)
	if rev == 0 {
		return err
	}
	f(d, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := s.client.Watch(clientv3.WithRequireLeader(wctx), s.key, clientv3.WithRev(rev+1))
	tick := time.NewTicker(s.check)
	defer tick.Stop()
	for {
		select {
		case wr, ok := <-ch:
			if !ok {
				return fmt.Errorf("rulesetcd: watch %q: %w: the watch ended", s.key, throttle.ErrUnavailable)
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("rulesetcd: watch %q: %w: %w", s.key, throttle.ErrUnavailable, err)
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					f(rules.Document{}, s.missing())
				} else {
					f(doc(ev.Kv.Value, ev.Kv.ModRevision), nil)
				}
			}
		case <-tick.C:
			if _, rev, err := s.getWithin(ctx); rev == 0 && ctx.Err() == nil {
				f(rules.Document{}, err) // the watch waits for etcd; say it is gone
			}
		}
	}
}

// getWithin is get with the retry interval as its deadline.
func (s *Source) getWithin(ctx context.Context) (rules.Document, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.retry)
	defer cancel()
	return s.get(ctx)
}
