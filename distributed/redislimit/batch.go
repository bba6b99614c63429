package redislimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts of concurrent callers together: still one
// atomic script per decision, but many decisions per round trip. A call
// that finds no call in flight runs at once on its own (no added latency
// for a lone caller); calls that arrive meanwhile queue, and when the
// running call returns, a short-lived goroutine sends the whole queue as
// one pipeline, then the next queue, until none is left. Waiters return
// at their own deadline whatever happens to the pipeline.
type batcher struct {
	mu    sync.Mutex
	busy  bool
	queue []*pending
	spare []*pending
}

// pending is one queued script call.
type pending struct {
	s     *luaScript
	keys  []string
	args  []any
	done  chan struct{}
	state atomic.Int32 // queued, sent (taken by drain) or abandoned (its caller gave up first)
	v     any
	err   error
}

// States of a pending call: a call abandoned while queued is never sent.
const (
	queued int32 = iota
	sent
	abandoned
)

// do runs s on keys and args through the batcher; eval runs one call
// alone.
func (c *core) do(ctx context.Context, s *luaScript, keys []string, args []any) (any, error) {
	b := &c.batch
	b.mu.Lock()
	if b.busy {
		p := &pending{s: s, keys: keys, args: args, done: make(chan struct{})}
		b.queue = append(b.queue, p)
		b.mu.Unlock()
		select {
		case <-p.done:
			return p.v, p.err
		case <-ctx.Done():
			p.state.CompareAndSwap(queued, abandoned) // not sent, if not sent yet
			return nil, ctx.Err()
		}
	}
	b.busy = true
	b.mu.Unlock()
	v, err := c.exec(ctx, s, keys, args)
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.busy = false
		b.mu.Unlock()
	} else {
		b.mu.Unlock()
		go c.drain()
	}
	return v, err
}

// drain sends the queue as pipelines until it is empty.
func (c *core) drain() {
	b := &c.batch
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue, b.spare = b.spare[:0], nil
		if len(batch) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		live := batch[:0:0]
		for _, p := range batch {
			if p.state.CompareAndSwap(queued, sent) {
				live = append(live, p)
			}
		}
		ctx, cancel := c.deadlines.With(context.Background())
		if len(live) > 0 {
			c.pipeline(ctx, live)
		}
		if cancel != nil {
			cancel()
		}
		for i, p := range batch {
			close(p.done)
			batch[i] = nil
		}
		b.mu.Lock()
		if b.spare == nil {
			b.spare = batch[:0]
		}
		b.mu.Unlock()
	}
}

// pipeline runs the calls of batch in one round trip, and sends again
// with EVAL those that Redis answered NOSCRIPT. With WithReplicas, each
// pipeline ends with WAIT, and fails every call it could not confirm.
func (c *core) pipeline(ctx context.Context, batch []*pending) {
	pipe := c.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, p := range batch {
		cmds[i] = pipe.EvalSha(ctx, p.s.sha, p.keys, p.args...)
	}
	wait := c.wait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	missing := false
	for i, cmd := range cmds {
		p := batch[i]
		p.v, p.err = cmd.Result()
		missing = missing || p.err != nil && strings.HasPrefix(p.err.Error(), "NOSCRIPT")
	}
	c.confirm(wait, batch, cmds)
	if !missing {
		return
	}
	pipe = c.client.Pipeline()
	for i, p := range batch {
		cmds[i] = nil
		if p.err != nil && strings.HasPrefix(p.err.Error(), "NOSCRIPT") {
			cmds[i] = pipe.Eval(ctx, p.s.src, p.keys, p.args...)
		}
	}
	wait = c.wait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		if cmd != nil {
			batch[i].v, batch[i].err = cmd.Result()
		}
	}
	c.confirm(wait, batch, cmds)
}

// wait queues WAIT on pipe when WithReplicas asks for it.
func (c *core) wait(ctx context.Context, pipe redis.Pipeliner) *redis.IntCmd {
	if c.replicas == 0 {
		return nil
	}
	cmd := redis.NewIntCmd(ctx, "wait", c.replicas, c.waitFor.Milliseconds())
	_ = pipe.Process(ctx, cmd) // queued: sent by Exec
	return cmd
}

// confirm fails the calls of batch sent by cmds (nil: not sent by this
// pipeline) that succeeded if WAIT did not see enough replicas.
func (c *core) confirm(wait *redis.IntCmd, batch []*pending, cmds []*redis.Cmd) {
	if wait == nil {
		return
	}
	n, err := wait.Result()
	if err == nil && n >= int64(c.replicas) {
		return
	}
	if err == nil {
		err = fmt.Errorf("%w (%d of %d)", errNotReplicated, n, c.replicas)
	}
	for i, p := range batch {
		if cmds[i] != nil && p.err == nil {
			p.v, p.err = nil, err
		}
	}
}
