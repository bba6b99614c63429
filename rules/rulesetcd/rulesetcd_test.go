package rulesetcd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/etcdtest"
	"github.com/throttlekit/throttle/rules"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const key = "/config/rules"

// newClient returns a client of endpoint, closed when the test ends.
func newClient(t *testing.T, endpoint string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return must(t, c, err)
}

func must[T any](t *testing.T, v T, err error) T {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func bucketDoc(burst int) string {
	return fmt.Sprintf(`{"default": {"rate": "1/h", "burst": %d}}`, burst)
}

func put(t *testing.T, c *clientv3.Client, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, v); err != nil {
		t.Fatal(err)
	}
}

// reloads collects a Limiter's reload outcomes.
type reloads chan error

// observer passes on the outcome of each reload: nil for rules put in
// force (EventReload), the error of a rejected document (EventWarning).
func (r reloads) observer() rules.Option {
	return rules.WithObserver("rules", throttle.ObserverFunc(func(e throttle.Event) {
		switch e.Kind {
		case throttle.EventReload:
			r <- nil
		case throttle.EventWarning:
			r <- e.Err
		}
	}))
}

// next returns the next outcome.
func (r reloads) next(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no reload")
		return nil
	}
}

func burst(l *rules.Limiter) int { q, _, _ := l.KeyQuota("k"); return q.Limit }

// The key's document is followed; a bad document or a deletion is refused
// and the good one kept; with etcd killed the good one stays, and after a
// restart the watch resumes; a service started while etcd is down starts
// from the cached document.
func TestFollowKey(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv.Endpoints[0])
	put(t, c, bucketDoc(10))
	cache := filepath.Join(t.TempDir(), "rules.json")
	src := rules.Cached(New(c, key, WithRetry(200*time.Millisecond), WithCheckInterval(100*time.Millisecond)), cache)
	r := make(reloads, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := rules.OpenSource(ctx, src, 5*time.Second, r.observer())
	must(t, l, err)
	defer l.Close()
	if burst(l) != 10 {
		t.Fatalf("burst %d, want 10", burst(l))
	}
	for i := 0; i < 7; i++ {
		l.Allow(ctx, "k", 1)
	}
	done := make(chan error, 1)
	go func() { done <- l.Follow(ctx, src, 0) }()

	put(t, c, bucketDoc(5))
	if err := r.next(t); err != nil || burst(l) != 5 {
		t.Fatalf("update: %v, burst %d", err, burst(l))
	}
	if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
		t.Fatal("usage lost on reload: 7 used of 5 and still admitted")
	}
	put(t, c, `{"default": {"rate": "1/h"}}`)
	if err := r.next(t); !errors.Is(err, throttle.ErrInvalid) || burst(l) != 5 {
		t.Fatalf("bad document: %v, burst %d", err, burst(l))
	}
	if _, err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := r.next(t); !errors.Is(err, throttle.ErrInvalid) || burst(l) != 5 {
		t.Fatalf("deleted key: %v, burst %d", err, burst(l))
	}
	put(t, c, bucketDoc(6))
	if err := r.next(t); err != nil || burst(l) != 6 {
		t.Fatalf("update: %v, burst %d", err, burst(l))
	}

	srv.Kill()
	if err := r.next(t); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("with etcd killed: %v, want the outage reported", err)
	}
	if _, err := l.Allow(ctx, "other", 1); err != nil || burst(l) != 6 {
		t.Fatalf("with etcd killed: %v, burst %d", err, burst(l))
	}
	// A service started now starts from the cache.
	down := rules.Cached(New(newClient(t, srv.Endpoints[0]), key), cache)
	l2, err := rules.OpenSource(ctx, down, 500*time.Millisecond)
	if err != nil {
		t.Fatalf("start with etcd down: %v", err)
	}
	if burst(l2) != 6 {
		t.Fatalf("started with etcd down on burst %d, want the cached 6", burst(l2))
	}
	l2.Close()

	srv.Restart(t)
	put(t, c, bucketDoc(3))
	for {
		err := r.next(t)
		if err == nil && burst(l) == 3 {
			break
		}
		if !errors.Is(err, throttle.ErrUnavailable) { // the watch may report the outage
			t.Fatalf("after the restart: %v, burst %d", err, burst(l))
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow = %v", err)
	}
}

// TestCachedBadValueAtStart: a value at the key that is not a valid
// document, at start-up, is treated like an unreachable etcd: the last
// good file stands in. Before, OpenSource failed.
func TestCachedBadValueAtStart(t *testing.T) {
	srv := etcdtest.Start(t)
	c := newClient(t, srv.Endpoints[0])
	cache := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(cache, []byte(bucketDoc(6)), 0o600); err != nil {
		t.Fatal(err)
	}
	put(t, c, `{"default": {"rate": "1/h"}}`)
	l, err := rules.OpenSource(context.Background(), rules.Cached(New(c, key), cache), 5*time.Second)
	if err != nil {
		t.Fatalf("a bad value at start-up with a good file: %v", err)
	}
	defer l.Close()
	if burst(l) != 6 {
		t.Fatalf("started on burst %d, want the cached 6", burst(l))
	}
}
