// Package gossip is a distributed token bucket for a cluster of hosts
// behind a load balancer: each node decides locally (no network round
// trip on the request path) and is charged, one gossip interval later,
// for what every other node admitted.
//
//	tr, err := gossip.ListenUDP("10.0.0.5:7946")
//	node, err := gossip.NewNode(gossip.Config{Transport: tr, Secret: secret, SpendCap: true,
//		Peers: []string{"10.0.0.6:7946", "10.0.0.7:7946"}})
//	api, err := node.NewLimiter("api", throttle.PerSecond(100), 200)
//	node.Start()
//	defer node.Close()
//	d, err := api.Allow(ctx, clientKey, 1)
//
// Each node keeps, per limit and per key, a token bucket (the GCRA of
// package tokenbucket) and a count of the units it admitted. Every
// Interval it sends its peers those counts, as cumulative counters; a
// peer debits the growth from its own buckets, which may go negative, so a
// client that burst on every node pays it back on every node. Datagrams
// are authenticated with HMAC-SHA256 under Config.Secret, bound to their
// receiver and numbered, so forged, malformed and replayed ones are
// dropped and counted (Stats). The protocol, its simulations and its
// measurements are described in docs/design/gossip.md in the repository.
//
// # Guarantees
//
// Long run: every admitted unit is charged on every node once the reports
// arrive, so the cluster's long-run rate is the configured rate, whatever
// the number of nodes; lost, duplicated and reordered datagrams neither
// lose nor double-count hits.
//
// Burst without the spend cap: before the first report arrives each node
// may admit a full burst, so the cluster admits up to N x burst, then
// refuses until the debt is paid back.
//
// Burst with the cap (Config.SpendCap): if every node has the same view
// (reports of the last round delivered, synchronized clocks), the cluster
// admits at most burst + rate*d in any window of length d, like a single
// bucket; if the nodes disagree only on the tokens left (a report in
// flight), at most burst + rate*d + N-1. If reports are lost the bound
// degrades, at worst to N x burst. While demand shifts between nodes, a
// node may refuse although tokens are left on others (the long-run rate
// holds).
//
// Attacks: what a peer reports is capped at what it could have admitted
// (burst plus two rounds of refill per key), so a node holding the secret
// can charge its peers no more than an honest node at full speed; a state
// a joining node catches up from lowers a bucket no further than every
// member's reports could; a node's incarnation is random, so a restart
// after its clock was set back is a new incarnation.
//
// Memory: each limiter tracks at most the node's throttle.WithMaxKeys
// keys; past it, new keys share one bucket under OverflowKey, limited and
// gossiped like any key, never unlimited. A round carries at most
// Config.MaxRoundBytes per peer, so traffic is bounded whatever the number
// of keys.
//
// Residual inaccuracies: a report debited to a bucket that refilled to
// full meanwhile charges up to rate x interval more than one global
// bucket would (never less); clocks must agree within about one interval;
// a counter idle for longer than the retention (twice the time to refill
// the bucket, at least 10 rounds) is forgotten, so a peer that comes back
// later misses those hits.
//
// # Transports and membership
//
// Transport is an interface: ListenUDP sends datagrams of at most
// MaxPacket bytes over UDP; Network is an in-memory network on virtual
// time with loss, duplication, delay and partitions, for tests and
// simulations. Members are a static list (Config.Peers) changed at run
// time with Node.Join and Node.Leave, which a membership library such as
// hashicorp/memberlist can drive from its join and leave events. Version 2
// of the wire format does not understand version 1: upgrade every node of
// a cluster together.
package gossip
