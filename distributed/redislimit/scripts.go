package redislimit

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

// luaScript is a script and its SHA-1, computed once. It is called by
// EVALSHA; when Redis answers NOSCRIPT (after SCRIPT FLUSH, a restart or
// a failover) it is sent once with EVAL, which loads it again.
type luaScript struct {
	src, sha string
}

// script returns the script lua/<name>.lua behind the shared prelude.
func script(name string) *luaScript {
	prelude, err := luaFS.ReadFile("lua/prelude.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	src := string(prelude) + "\n" + string(body)
	sum := sha1.Sum([]byte(src))
	return &luaScript{src: src, sha: hex.EncodeToString(sum[:])}
}

// run evaluates s: EVALSHA, and EVAL on NOSCRIPT.
func (s *luaScript) run(ctx context.Context, c redis.Scripter, keys []string, args []any) (any, error) {
	v, err := c.EvalSha(ctx, s.sha, keys, args...).Result()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		v, err = c.Eval(ctx, s.src, keys, args...).Result()
	}
	return v, err
}

var (
	gcraScript          = script("gcra")
	refundScript        = script("gcra_refund")
	leaseScript         = script("gcra_lease")
	fixedWindowScript   = script("fixedwindow")
	slidingLogScript    = script("slidinglog")
	slidingWindowScript = script("slidingwindow")
	concurrencyScript   = script("concurrency")
	extendScript        = script("concurrency_extend")
)
