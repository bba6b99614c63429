package main

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// capListener closes the connections beyond max open at once as soon as
// it accepts them, so that a flood of connections on one port cannot take
// the file descriptors the other port, etcd and the parent need. Listeners
// that share open share the bound. It is safe for concurrent use.
type capListener struct {
	net.Listener
	max     int64
	open    *atomic.Int64
	refused func() // counts a refused connection
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &capConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		c.Close()
		l.refused()
	}
}

type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// newHTTPServer returns a server of h bounded by l: the time a client
// may take to send its request (headers, then body) and to read the
// answer, how long a connection may stay idle, and the size of headers.
func newHTTPServer(h http.Handler, l httpLimits, idle time.Duration) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		WriteTimeout:      l.write,
		IdleTimeout:       idle,
		MaxHeaderBytes:    l.maxHeaderBytes,
	}
}
