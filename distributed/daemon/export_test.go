package daemon

import (
	"io"
	"net"
)

// The replies of the protocol, and the server's inspection hooks, for
// the package's external tests.
const (
	ReplyOK      = replyOK
	ReplyNO      = replyNO
	ReplyError   = replyError
	ReplyPong    = replyPong
	ReplyRefused = replyRefused
	MaxStateAge  = maxStateAge
)

// Tokens returns the tokens left for tag in this daemon's bucket of it.
func (s *Server) Tokens(tag string) int64 { return s.tagTokens(tag) }

// AdminAddr returns the address of the admin listener, or nil.
func (s *Server) AdminAddr() net.Addr { return s.adminAddr() }

// WriteMetrics writes the server's counters in the Prometheus text format.
func (s *Server) WriteMetrics(w io.Writer) error { return s.writeMetrics(w) }

// The routings' names, for the package's external tests.
const (
	RoutingAll   = routingAll
	RoutingOwner = routingOwner
)
