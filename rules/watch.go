package rules

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/throttlekit/throttle"
)

// fileState is what Reload and Watch know of the rules file.
type fileState struct {
	path    string
	seen    []byte // the content last put in force or rejected
	pending []byte // Watch: a new content read once, not yet acted on
	waiting bool   // Watch: pending is set
	failed  bool   // Watch: the last read failed
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: %s: %w", path, err)
	}
	return data, nil
}

// Open returns a Limiter enforcing the rules document at path, which
// Reload and Watch read again. See Parse and New for the errors.
func Open(path string, opts ...Option) (*Limiter, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	l, err := New(c, opts...)
	if err != nil {
		return nil, err
	}
	l.file = fileState{path: path, seen: data}
	v := docHash(data)
	l.version.Store(&v)
	return l, nil
}

// Reload reads the rules file again and puts it in force (see Update). A
// file that cannot be read, parsed or built is rejected: the rules in force
// stay, the error is returned and reported to the WithErrorFunc function
// and the WithObserver observer. Reload is for a Limiter made by Open.
func (l *Limiter) Reload() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	data, err := readFile(l.file.path)
	if err != nil {
		return l.reject(l.file.path, err)
	}
	return l.use(data)
}

// usable fails for a Limiter not made by Open, or closed.
func (l *Limiter) usable() error {
	if l.file.path == "" {
		return fmt.Errorf("%w: rules: Reload and Watch need a Limiter made by Open", throttle.ErrInvalid)
	}
	if t := l.cur.Load(); t == nil || t.closed {
		return errClosed
	}
	return nil
}

// use parses data and puts it in force, or rejects it.
func (l *Limiter) use(data []byte) error {
	l.file.seen = data
	c, err := Parse(data)
	if err == nil {
		err = l.apply(c)
	}
	if err != nil {
		return l.reject(l.file.path, err)
	}
	v := docHash(data)
	l.version.Store(&v)
	l.reloaded()
	return nil
}

// reject reports that what is named by what was not put in force, and
// returns why.
func (l *Limiter) reject(what string, err error) error {
	err = fmt.Errorf("%s: rejected, the previous rules stay in force: %w", what, err)
	l.rep.Event(throttle.Event{Kind: throttle.EventWarning, Err: err})
	if l.cfg.onError != nil {
		l.cfg.onError(err)
	}
	return err
}

// reloaded reports an EventReload naming the version of the rules put in
// force.
func (l *Limiter) reloaded() {
	l.rep.Event(throttle.Event{Kind: throttle.EventReload, Key: l.Version()})
}

// poll is one look of Watch at the file. A new content is acted on only
// when the next look reads it again, so a file caught while it is being
// written (emptied, half written) is neither put in force nor rejected. A
// failed read is reported when the next look fails too.
func (l *Limiter) poll() {
	data, err := readFile(l.file.path)
	if err != nil {
		l.file.pending, l.file.waiting = nil, false
		if l.file.failed {
			_ = l.reject(l.file.path, err)
		}
		l.file.failed = true
		return
	}
	l.file.failed = false
	switch {
	case bytes.Equal(data, l.file.seen):
		l.file.pending, l.file.waiting = nil, false
	case l.file.waiting && bytes.Equal(data, l.file.pending):
		l.file.pending, l.file.waiting = nil, false
		_ = l.use(data)
	default:
		l.file.pending, l.file.waiting = data, true
	}
}

// Watch reads the rules file every interval until ctx is done, and
// reloads it (see Reload) when its content changed and then read the same
// one interval later: a file caught while it is being written in place is
// neither put in force nor rejected, and a change takes between one and
// two intervals. A rejected version is reported once; a file that cannot
// be read twice in a row is reported at every interval. Writing a new file
// and renaming it over the old one is still the way to change it
// atomically. Watch returns ctx's error, or at once an error wrapping
// throttle.ErrInvalid for a Limiter not made by Open or an interval <= 0.
// Run it in its own goroutine.
func (l *Limiter) Watch(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: rules: Watch interval %v must be positive", throttle.ErrInvalid, interval)
	}
	l.mu.Lock()
	err := l.usable()
	l.mu.Unlock()
	if err != nil {
		return err
	}
	return l.every(ctx, interval, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.isClosed() {
			l.poll()
		}
	})
}

// every calls f every interval until ctx is done or l is closed.
func (l *Limiter) every(ctx context.Context, interval time.Duration, f func()) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if l.isClosed() {
				return errClosed
			}
			f()
		}
	}
}
