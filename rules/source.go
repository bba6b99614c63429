package rules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
)

// Document is one version of a rules document as a Source delivers it.
type Document struct {
	Data []byte
	// Version names this content (an ETag, a revision, a hash): two
	// Documents of a Source with the same Version have the same Data. An
	// empty Version is replaced by "sha256:" and the hex digest of Data.
	Version string
}

// Source delivers the current rules document: a file, a config service,
// a key of a store. Fetch returns it, or an error when it cannot be had
// (the rules in force then stay); it must return when ctx is done.
type Source interface {
	Fetch(ctx context.Context) (Document, error)
}

// Watcher is a Source that is told of changes: Watch calls f with each
// new Document, or with an error when the source is unreachable, until
// ctx is done, and returns ctx's error. Calls to f are sequential.
type Watcher interface {
	Source
	Watch(ctx context.Context, f func(Document, error)) error
}

// docHash returns a version naming data: "sha256:" and its hex digest.
func docHash(data []byte) string {
	h := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(h[:])
}

// FileSource is the rules document in a file. Its Version is the
// content's sha256 hash. A file edited in place can be read half written: to
// follow a file, Open and Limiter.Watch guard against that; FileSource is
// for a file replaced atomically (written aside and renamed).
type FileSource string

// Fetch reads the file.
func (f FileSource) Fetch(context.Context) (Document, error) {
	data, err := readFile(string(f))
	if err != nil {
		return Document{}, err
	}
	return Document{Data: data, Version: docHash(data)}, nil
}

// OpenSource returns a Limiter enforcing the document src fetches now,
// with a deadline of timeout (none if timeout <= 0). Refresh and Follow
// fetch it again. Errors are the source's, or as Parse and New return.
func OpenSource(ctx context.Context, src Source, timeout time.Duration, opts ...Option) (*Limiter, error) {
	d, err := fetch(ctx, src, timeout)
	if err != nil {
		return nil, err
	}
	c, err := Parse(d.Data)
	if err != nil {
		return nil, fmt.Errorf("rules: version %s: %w", d.Version, err)
	}
	l, err := New(c, opts...)
	if err != nil {
		return nil, err
	}
	l.version.Store(&d.Version)
	return l, nil
}

func fetch(ctx context.Context, src Source, timeout time.Duration) (Document, error) {
	if src == nil {
		return Document{}, fmt.Errorf("%w: rules: nil Source", throttle.ErrInvalid)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	d, err := src.Fetch(ctx)
	if err == nil && d.Version == "" {
		d.Version = docHash(d.Data)
	}
	return d, err
}

// Version returns the version of the document in force: its Document
// Version, the sha256 hash of a file's content (Open, Reload, Watch), or "" for
// rules given to New or Update. It takes no lock; in an Observer's
// EventReload it is the version just put in force.
func (l *Limiter) Version() string {
	if v := l.version.Load(); v != nil {
		return *v
	}
	return ""
}

// Refresh fetches src's document (with a deadline of timeout, none if
// timeout <= 0) and puts it in force if its Version is not the one in
// force (see Update). A failed fetch, or a document that does not parse or
// build, is rejected: the rules in force stay, the error is returned and
// reported to WithErrorFunc and WithObserver (a version already rejected
// is not reported again). A success is reported to WithObserver as an
// EventReload. Decisions never wait for a fetch. Refreshes running at once
// put their documents in force in the order their fetches end: follow a
// source from one goroutine (Follow).
func (l *Limiter) Refresh(ctx context.Context, src Source, timeout time.Duration) error {
	d, err := fetch(ctx, src, timeout)
	return l.take(d, err)
}

// Follow keeps l on src's document until ctx is done: if src is a Watcher,
// with each Document it delivers, else by Refresh every interval (whose
// timeout is the interval). It returns ctx's error, or at once an error
// wrapping throttle.ErrInvalid for a nil src or, when polling, an
// interval <= 0, or throttle.ErrClosed once l is closed. Run it in its own
// goroutine.
func (l *Limiter) Follow(ctx context.Context, src Source, interval time.Duration) error {
	if src == nil {
		return fmt.Errorf("%w: rules: nil Source", throttle.ErrInvalid)
	}
	if w, ok := src.(Watcher); ok {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		err := w.Watch(ctx, func(d Document, err error) {
			if err == nil && d.Version == "" {
				d.Version = docHash(d.Data)
			}
			if errors.Is(l.take(d, err), throttle.ErrClosed) {
				cancel()
			}
		})
		if l.isClosed() {
			return errClosed
		}
		return err
	}
	if interval <= 0 {
		return fmt.Errorf("%w: rules: Follow interval %v must be positive", throttle.ErrInvalid, interval)
	}
	return l.every(ctx, interval, func() { _ = l.Refresh(ctx, src, interval) })
}

func (l *Limiter) isClosed() bool {
	t := l.cur.Load()
	return t != nil && t.closed
}

// take puts a fetched document in force, or rejects it or the failure.
func (l *Limiter) take(d Document, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.cur.Load(); t == nil {
		return errZero
	} else if t.closed {
		return errClosed
	}
	if err != nil {
		return l.reject("rules source", err)
	}
	if d.Version == l.Version() || d.Version == l.refused {
		return nil
	}
	c, err := Parse(d.Data)
	if err == nil {
		err = l.apply(c)
	}
	if err != nil {
		l.refused = d.Version
		return l.reject("rules version "+d.Version, err)
	}
	l.refused = ""
	l.version.Store(&d.Version)
	l.reloaded()
	return nil
}

// Cached returns src keeping its last good document (one that parses) in
// the file at path: when src's first fetch fails, or delivers a document
// that does not parse (a 200 with garbage or an HTML page, a bad value in
// a store), the file's document is delivered instead (once; later
// failures are returned, and later bad documents delivered for the
// Limiter to reject), so a service starts on the last rules it had while
// its config service is down or broken. The file is written aside and
// renamed over, and not written for a document that does not parse. The
// result is a Watcher if src is one; follow the result, not src, so that
// the file is kept up to date.
func Cached(src Source, path string) Source {
	c := &cached{src: src, path: path}
	if w, ok := src.(Watcher); ok {
		return &cachedWatcher{cached: c, w: w}
	}
	return c
}

type cached struct {
	src  Source
	path string

	mu      sync.Mutex
	fetched bool   // src delivered a document
	stood   bool   // the file stood in for src once
	written string // the Version last written
}

func (c *cached) Fetch(ctx context.Context) (Document, error) {
	if c.src == nil {
		return Document{}, fmt.Errorf("%w: rules: nil Source", throttle.ErrInvalid)
	}
	d, err := c.src.Fetch(ctx)
	return c.filter(d, err)
}

// filter records a good document, or stands in for a failure: a fetch
// that failed or a document that does not parse, before src delivered a
// good one.
func (c *cached) filter(d Document, err error) (Document, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var bad error
	if err == nil {
		if d.Version == "" {
			d.Version = docHash(d.Data)
		}
		if d.Version != c.written { // not known good
			_, bad = Parse(d.Data)
		}
	}
	if err != nil || bad != nil {
		if c.fetched || c.stood {
			return d, err // the failure, or the bad document, is the caller's to reject
		}
		return c.standIn(d, err, bad)
	}
	c.fetched = true
	if d.Version != c.written {
		if werr := writeAtomic(c.path, d.Data); werr != nil {
			return d, nil // the document is good; the cache is best effort
		}
		c.written = d.Version
	}
	return d, nil
}

// standIn delivers the file's document in place of src's first answer: a
// failure err, or a document d that failed validation with bad.
func (c *cached) standIn(d Document, err, bad error) (Document, error) {
	if bad != nil {
		err = fmt.Errorf("rules: fetched document: %w", bad)
	}
	data, rerr := readFile(c.path)
	if rerr != nil {
		return c.firstFailure(d, err, bad, fmt.Errorf("rules: no cached document: %w", rerr))
	}
	if _, perr := Parse(data); perr != nil {
		return c.firstFailure(d, err, bad, fmt.Errorf("rules: cached document %s: %w", c.path, perr))
	}
	c.stood = true
	return Document{Data: data, Version: docHash(data)}, nil
}

// firstFailure is src's first answer when the file cannot stand in: a bad
// document is delivered as it is (for the caller to reject with its own
// error), a failure joined with the file's.
func (c *cached) firstFailure(d Document, err, bad, ferr error) (Document, error) {
	if bad != nil {
		return d, nil
	}
	return d, errors.Join(err, ferr)
}

type cachedWatcher struct {
	*cached
	w Watcher
}

func (c *cachedWatcher) Watch(ctx context.Context, f func(Document, error)) error {
	return c.w.Watch(ctx, func(d Document, err error) { f(c.filter(d, err)) })
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
