package rules

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/throttlekit/throttle"
)

// HTTPSource is a rules document served over HTTP(S) by a config
// service. Fetch makes a conditional GET: once a response carried an
// ETag, it sends If-None-Match, and a 304 Not Modified returns the
// document it already has. A Document's Version is the response's ETag,
// else the sha256 hash of the body. Set the fields before the first Fetch; Fetch
// is safe for concurrent use. Wrap it in Cached to start from the last
// good document when the service is down, and give Refresh, OpenSource
// and Follow a timeout so that a hanging service fails the fetch.
type HTTPSource struct {
	URL    string
	Client *http.Client // nil: http.DefaultClient
	// MaxSize bounds the body in bytes; 0 means 4 MiB, the largest document. A larger
	// body is an error wrapping throttle.ErrInvalid.
	MaxSize int64

	mu   sync.Mutex
	last Document
	etag string
}

// Fetch gets the document. A transport failure or a status other than
// 200 and 304 is an error wrapping throttle.ErrUnavailable.
func (s *HTTPSource) Fetch(ctx context.Context) (Document, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Document{}, fmt.Errorf("%w: rules: %v", throttle.ErrInvalid, err)
	}
	s.mu.Lock()
	last, etag := s.last, s.etag
	s.mu.Unlock()
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	c := s.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return Document{}, fmt.Errorf("rules: %w: %w", throttle.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && etag != "":
		return last, nil
	case resp.StatusCode != http.StatusOK:
		return Document{}, fmt.Errorf("rules: %w: GET %s: %s", throttle.ErrUnavailable, s.URL, resp.Status)
	}
	max := s.MaxSize
	if max <= 0 {
		max = maxConfigSize
	}
	if resp.ContentLength > max {
		return Document{}, fmt.Errorf("%w: rules: GET %s: body of %d bytes is larger than %d", throttle.ErrInvalid, s.URL, resp.ContentLength, max)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return Document{}, fmt.Errorf("rules: %w: GET %s: %w", throttle.ErrUnavailable, s.URL, err)
	}
	if int64(len(data)) > max {
		return Document{}, fmt.Errorf("%w: rules: GET %s: body larger than %d bytes", throttle.ErrInvalid, s.URL, max)
	}
	d := Document{Data: data, Version: resp.Header.Get("ETag")}
	if d.Version == "" {
		d.Version = docHash(data)
	}
	s.mu.Lock()
	s.last, s.etag = d, resp.Header.Get("ETag")
	s.mu.Unlock()
	return d, nil
}
