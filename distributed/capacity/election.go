package capacity

import "context"

// Leadership says who is the master of a level of servers.
type Leadership struct {
	Master   string // address of the current master; "" while unknown
	IsMaster bool   // this replica is the master
	Term     int64  // grows with every change of master; a fencing token
}

// Election elects one master among the replicas of a level.
type Election interface {
	// Campaign takes part in the election under address until ctx is done,
	// calling report on every change of leadership (never concurrently).
	// It gives up mastership before it returns.
	Campaign(ctx context.Context, address string, report func(Leadership)) error
}

// Solo is the Election of a single server: it is always the master.
type Solo struct{}

var _ Election = Solo{}

// Campaign reports address as the master in term 1 and waits for ctx to
// be done; it returns ctx's error.
func (Solo) Campaign(ctx context.Context, address string, report func(Leadership)) error {
	report(Leadership{Master: address, IsMaster: true, Term: 1})
	<-ctx.Done()
	return ctx.Err()
}
