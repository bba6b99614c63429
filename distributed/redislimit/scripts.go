package redislimit

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

// script returns the script lua/<name>.lua behind the shared prelude. It
// is sent once per server with EVAL (go-redis's Script.Run falls back to
// EVAL when EVALSHA reports NOSCRIPT: after SCRIPT FLUSH, a restart or a
// failover) and called by EVALSHA afterwards.
func script(name string) *redis.Script {
	prelude, err := luaFS.ReadFile("lua/prelude.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(prelude) + "\n" + string(body))
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
