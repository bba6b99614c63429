package envoyrls

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
)

// Source keeps a Service's configuration in step with a file or a
// directory of files (see readFiles): Reload reads them on demand (on
// SIGHUP, say), Watch whenever their content changes and has stayed the
// same for one interval, so that files caught half written are not acted
// on. A version that does not load is refused as a whole and the
// configuration in force stays. Safe for concurrent use.
type Source struct {
	path string
	opts LoadOptions
	svc  *Service
	// OnError, if set, gets the errors of Watch's reloads.
	OnError func(error)

	mu      sync.Mutex
	seen    [32]byte // the content last put in force or refused
	pending [32]byte // Watch: a new content seen once
	waiting bool
}

// Open loads path and returns a Source for it with the Service that
// answers from it (options o); a configuration that does not load is an
// error wrapping ErrInvalidConfig.
func Open(path string, lo LoadOptions, o Options) (*Service, *Source, error) {
	src := &Source{path: path, opts: lo}
	files, err := readFiles(path)
	if err != nil {
		return nil, nil, fmt.Errorf("envoyrls: %w", err)
	}
	cfg, err := parse(files, lo)
	if err != nil {
		return nil, nil, err
	}
	src.seen = digest(files)
	src.svc = newService(cfg, o)
	return src.svc, src, nil
}

func digest(files []configFile) [32]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// Reload reads the files again and puts them in force; on an error the
// configuration in force stays and the error is returned.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	files, err := readFiles(s.path)
	if err != nil {
		return fmt.Errorf("envoyrls: %w", err)
	}
	return s.apply(files, digest(files))
}

func (s *Source) apply(files []configFile, d [32]byte) error {
	s.seen, s.waiting = d, false
	cfg, err := parse(files, s.opts)
	if err != nil {
		return err
	}
	s.svc.setConfig(cfg)
	return nil
}

// Watch polls the files every interval until ctx ends, and reloads them
// when their content has changed and then read the same twice in a row.
// Errors go to OnError. It returns ctx's error, or at once an error
// wrapping throttle.ErrInvalid for an interval <= 0.
func (s *Source) Watch(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: envoyrls: Watch interval %v must be positive", throttle.ErrInvalid, interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := s.poll(); err != nil && s.OnError != nil {
			s.OnError(err)
		}
	}
}

func (s *Source) poll() error {
	files, err := readFiles(s.path)
	if err != nil {
		return fmt.Errorf("envoyrls: %w", err)
	}
	d := digest(files)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case d == s.seen:
		s.waiting = false
		return nil
	case !s.waiting || d != s.pending:
		s.pending, s.waiting = d, true
		return nil
	}
	return s.apply(files, d)
}
