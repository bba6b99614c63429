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
	path string
	seen []byte // the content last read, in force or rejected
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
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
	return l, nil
}

// Reload reads the rules file again and puts it in force (see Update). A
// file that cannot be read, parsed or built is rejected: the rules in force
// stay, the error is returned and reported to the WithReloadHook function
// and the WithObserver observer. Reload is for a Limiter made by Open.
func (l *Limiter) Reload() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reload(false)
}

// reload reads the file; with ifChanged, it does nothing when the content
// is the one last read (in force or rejected).
func (l *Limiter) reload(ifChanged bool) error {
	if l.file.path == "" {
		return fmt.Errorf("%w: rules: Reload needs a Limiter made by Open", throttle.ErrInvalid)
	}
	if t := l.cur.Load(); t == nil || t.closed {
		return errClosed
	}
	data, err := readFile(l.file.path)
	if err == nil && ifChanged && bytes.Equal(data, l.file.seen) {
		return nil
	}
	if err == nil {
		l.file.seen = data
		var c *Config
		if c, err = Parse(data); err == nil {
			err = l.apply(c)
		}
	}
	if err != nil {
		err = fmt.Errorf("%s: rejected, the previous rules stay in force: %w", l.file.path, err)
		if o := l.cfg.observer; o != nil {
			o.Observe(throttle.Event{Kind: throttle.EventWarning, Limiter: l.cfg.name, Err: err})
		}
	}
	if l.cfg.onReload != nil {
		l.cfg.onReload(err)
	}
	return err
}

// Watch reads the rules file every interval until ctx is done, and
// reloads it when its content changed (see Reload). A file that cannot be
// read is reported at every interval; a rejected version is reported once. It returns ctx's error, or at once an error
// wrapping throttle.ErrInvalid for a Limiter not made by Open or an
// interval <= 0. Run it in its own goroutine.
func (l *Limiter) Watch(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: rules: Watch interval %v must be positive", throttle.ErrInvalid, interval)
	}
	l.mu.Lock()
	path := l.file.path
	l.mu.Unlock()
	if path == "" {
		return fmt.Errorf("%w: rules: Watch needs a Limiter made by Open", throttle.ErrInvalid)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			l.mu.Lock()
			if t := l.cur.Load(); t != nil && t.closed {
				l.mu.Unlock()
				return errClosed
			}
			_ = l.reload(true)
			l.mu.Unlock()
		}
	}
}
