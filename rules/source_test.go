package rules_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/throttletest"
)

// configServer is a config service on loopback whose behaviour the test
// switches: it serves its document with an ETag and answers 304 to a
// matching If-None-Match, or fails, hangs, or serves garbage or too much.
type configServer struct {
	*httptest.Server
	mu          sync.Mutex
	mode, doc   string
	notModified atomic.Int32
	release     chan struct{}
}

func newConfigServer(t *testing.T, doc string) *configServer {
	s := &configServer{mode: "ok", doc: doc, release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() { close(s.release); s.Close() })
	return s
}

func (s *configServer) set(mode, doc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = mode
	if doc != "" {
		s.doc = doc
	}
}

func (s *configServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	mode, doc := s.mode, s.doc
	s.mu.Unlock()
	hang := func() {
		select {
		case <-r.Context().Done():
		case <-s.release:
		}
	}
	switch mode {
	case "ok":
		etag := `"` + rules.Hash([]byte(doc))[7:23] + `"`
		if r.Header.Get("If-None-Match") == etag {
			s.notModified.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		w.Write([]byte(doc))
	case "500":
		http.Error(w, "down", http.StatusInternalServerError)
	case "hang": // never answers
		hang()
	case "hang-body": // answers, then stalls halfway through the body
		w.Write([]byte(doc[:len(doc)/2]))
		w.(http.Flusher).Flush()
		hang()
	case "garbage":
		w.Write([]byte("<html>it works</html>"))
	case "big-chunked": // no Content-Length: the reader must stop
		chunk := strings.Repeat(" ", 64<<10)
		for i := 0; i < 20; i++ {
			if _, err := w.Write([]byte(chunk)); err != nil {
				return
			}
		}
	case "big-length":
		w.Header().Set("Content-Length", "1000000000")
		w.Write([]byte(doc))
	}
}

type hookLog struct {
	mu   sync.Mutex
	errs []error
}

func (h *hookLog) hook(err error) { h.mu.Lock(); h.errs = append(h.errs, err); h.mu.Unlock() }

// reloads observes the outcome of each reload: f(nil) for rules put in
// force (EventReload), f(err) for a rejected document (EventWarning).
func reloads(f func(error)) rules.Option {
	return rules.WithObserver("api", throttle.ObserverFunc(func(e throttle.Event) {
		switch e.Kind {
		case throttle.EventReload:
			f(nil)
		case throttle.EventWarning:
			f(e.Err)
		}
	}))
}

func (h *hookLog) all() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.errs...)
}

// A config service that fails, hangs, serves garbage or too much never
// replaces the rules in force nor blocks a decision; a 304 keeps them; a
// new document is put in force keeping what keys have used.
func TestHTTPSource(t *testing.T) {
	srv := newConfigServer(t, bucketDoc("1/m", 10))
	src := &rules.HTTPSource{URL: srv.URL, MaxSize: 1 << 20}
	clk := throttletest.NewClock()
	var hooks hookLog
	var warnings atomic.Int32
	l, err := rules.OpenSource(ctx, src, time.Second, rules.WithLimiterOptions(throttle.WithClock(clk)),
		rules.WithErrorFunc(func(err error) { warnings.Add(1) }),
		reloads(hooks.hook))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	v1 := l.Version()
	if !strings.HasPrefix(v1, `"`) {
		t.Fatalf("Version = %q, want the ETag", v1)
	}
	for i := 0; i < 6; i++ {
		l.Allow(ctx, "k", 1)
	}
	burst := func() int { q, _, _ := l.KeyQuota("k"); return q.Limit }

	// Unchanged: a 304, nothing reloaded.
	if err := l.Refresh(ctx, src, time.Second); err != nil || srv.notModified.Load() != 1 || len(hooks.all()) != 0 {
		t.Fatalf("Refresh of an unchanged document: %v, %d 304s, hooks %v", err, srv.notModified.Load(), hooks.all())
	}

	// Every failure is rejected and leaves the rules (and the version) in force.
	const short = 50 * time.Millisecond // a hanging service costs this, not a test timeout
	for _, c := range []struct {
		mode    string
		timeout time.Duration
		want    error
	}{
		{"500", time.Minute, throttle.ErrUnavailable},
		{"hang", short, throttle.ErrUnavailable},
		{"hang-body", short, throttle.ErrUnavailable},
		{"garbage", time.Minute, throttle.ErrInvalid},
		{"big-chunked", time.Minute, throttle.ErrInvalid},
		{"big-length", time.Minute, throttle.ErrInvalid},
	} {
		srv.set(c.mode, "")
		err := l.Refresh(ctx, src, c.timeout)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: Refresh = %v, want %v", c.mode, err, c.want)
		}
		if l.Version() != v1 || burst() != 10 {
			t.Fatalf("%s: version %q burst %d: the good document was replaced", c.mode, l.Version(), burst())
		}
	}
	if n := len(hooks.all()); n != 6 || warnings.Load() != 6 {
		t.Fatalf("%d observed rejections, %d error func calls, want 6 each", n, warnings.Load())
	}

	// The same bad document again is not reported again.
	srv.set("garbage", "")
	if err := l.Refresh(ctx, src, time.Minute); err != nil || len(hooks.all()) != 6 { // this fetch must complete
		t.Fatalf("repeated garbage: %v, %d hook calls", err, len(hooks.all()))
	}

	// A hanging fetch does not hold up decisions.
	srv.set("hang", "")
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Refresh(hctx, src, 0) }()
	if d, err := l.Allow(ctx, "other", 1); err != nil || !d.Allowed {
		t.Fatalf("Allow during a hanging fetch: %+v, %v", d, err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fetch: %v", err)
	}

	// A new document is put in force; k keeps its usage (6 of 10 used).
	srv.set("ok", bucketDoc("1/m", 8))
	if err := l.Refresh(ctx, src, time.Second); err != nil {
		t.Fatal(err)
	}
	if l.Version() == v1 || burst() != 8 {
		t.Fatalf("new document not in force: version %q burst %d", l.Version(), burst())
	}
	if got := admitted(t, l, "k"); got != 2 {
		t.Fatalf("after the reload %d admitted, want 2: usage lost", got)
	}
	hs := hooks.all()
	if hs[len(hs)-1] != nil {
		t.Fatalf("last hook = %v, want nil", hs[len(hs)-1])
	}
}

// The last good document is kept on disk; a service down at start-up
// starts from it, and failures after that are reported.
func TestCachedSource(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "rules.cache.json")
	srv := newConfigServer(t, bucketDoc("1/m", 10))
	first := rules.Cached(&rules.HTTPSource{URL: srv.URL}, cache)
	l, err := rules.OpenSource(ctx, first, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	// A rejected document does not overwrite the cache.
	srv.set("garbage", "")
	if _, err := first.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cache); string(b) != bucketDoc("1/m", 10) {
		t.Fatalf("cache = %q", b)
	}

	// "Restart" with the service down.
	srv.set("500", "")
	if _, err := rules.OpenSource(ctx, &rules.HTTPSource{URL: srv.URL}, time.Second); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("without a cache: %v", err)
	}
	src := rules.Cached(&rules.HTTPSource{URL: srv.URL}, cache)
	l, err = rules.OpenSource(ctx, src, time.Second)
	if err != nil {
		t.Fatalf("with a cache: %v", err)
	}
	defer l.Close()
	if q, _, _ := l.KeyQuota("k"); q.Limit != 10 || l.Version() != rules.Hash([]byte(bucketDoc("1/m", 10))) {
		t.Fatalf("started on %v, version %q", q, l.Version())
	}
	if err := l.Refresh(ctx, src, time.Second); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("Refresh while down = %v, want the failure", err)
	}
	srv.set("ok", bucketDoc("1/m", 7))
	if err := l.Refresh(ctx, src, time.Second); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cache); string(b) != bucketDoc("1/m", 7) {
		t.Fatalf("cache not updated: %q", b)
	}
}

// TestCachedStartsOnInvalidDocument: at start-up, a document that fails
// validation (a 200 with garbage, an HTML error page) is treated like an
// unreachable service: the last good file stands in. Before, OpenSource
// failed although the file was good.
func TestCachedStartsOnInvalidDocument(t *testing.T) {
	for _, body := range []string{"garbage {", "<html><body>502 Bad Gateway</body></html>"} {
		cache := filepath.Join(t.TempDir(), "rules.cache.json")
		if err := os.WriteFile(cache, []byte(bucketDoc("1/m", 10)), 0o600); err != nil {
			t.Fatal(err)
		}
		srv := newConfigServer(t, body)
		src := rules.Cached(&rules.HTTPSource{URL: srv.URL}, cache)
		l, err := rules.OpenSource(ctx, src, time.Second)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if q, _, _ := l.KeyQuota("k"); q.Limit != 10 {
			t.Errorf("%q: started on %v", body, q)
		}
		// Later bad documents are the Limiter's to reject; a good one
		// replaces the file.
		if err := l.Refresh(ctx, src, time.Second); err == nil {
			t.Errorf("%q: a bad document refreshed without error", body)
		}
		srv.set("ok", bucketDoc("1/m", 7))
		if err := l.Refresh(ctx, src, time.Second); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(cache); string(b) != bucketDoc("1/m", 7) {
			t.Errorf("cache not updated: %q", b)
		}
		l.Close()
	}
}

// Follow polls a Source every interval and stops with ctx.
func TestFollowPolls(t *testing.T) {
	srv := newConfigServer(t, bucketDoc("1/m", 10))
	src := &rules.HTTPSource{URL: srv.URL}
	reloaded := make(chan error, 10)
	l, err := rules.OpenSource(ctx, src, time.Second, reloads(func(err error) { reloaded <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Follow(fctx, src, 5*time.Millisecond) }()
	srv.set("ok", bucketDoc("1/m", 4))
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if q, _, _ := l.KeyQuota("k"); q.Limit != 4 {
		t.Fatalf("limit %d after Follow, want 4", q.Limit)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow = %v", err)
	}
	if err := l.Follow(ctx, src, 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Follow with interval 0 = %v", err)
	}
}

// chanWatcher is a Watcher fed by the test.
type chanWatcher struct {
	rules.FileSource
	c chan func() (rules.Document, error)
}

func (w chanWatcher) Watch(ctx context.Context, f func(rules.Document, error)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case next := <-w.c:
			f(next())
		}
	}
}

// Follow takes a Watcher's documents as they come; a bad one and a
// failure keep the good one.
func TestFollowWatcher(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	write(t, path, bucketDoc("1/m", 10))
	w := chanWatcher{FileSource: rules.FileSource(path), c: make(chan func() (rules.Document, error))}
	reloaded := make(chan error)
	l, err := rules.OpenSource(ctx, w, 0, reloads(func(err error) { reloaded <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Follow(fctx, w, 0) }()
	send := func(d rules.Document, err error) error {
		w.c <- func() (rules.Document, error) { return d, err }
		return <-reloaded
	}
	if err := send(rules.Document{Data: []byte(`{"default": {}}`)}, nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("bad document: %v", err)
	}
	if err := send(rules.Document{}, throttle.ErrUnavailable); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("failure: %v", err)
	}
	if q, _, _ := l.KeyQuota("k"); q.Limit != 10 {
		t.Fatalf("limit %d, want the good document's 10", q.Limit)
	}
	if err := send(rules.Document{Data: []byte(bucketDoc("1/m", 3)), Version: "7"}, nil); err != nil || l.Version() != "7" {
		t.Fatalf("good document: %v, version %q", err, l.Version())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow = %v", err)
	}
}
