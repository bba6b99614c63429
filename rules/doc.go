// Package rules gives each key its own limit: per-key and per-prefix
// limits, tiers (free, pro, ...), an allow list that is never limited, a
// deny list that is always refused, and a default, read from a JSON
// document that can be reloaded while the service runs.
//
//	l, err := rules.Open("/etc/throttle/limits.json")
//	defer l.Close()
//	go l.Watch(ctx, 10*time.Second) // reload when the file changes
//	d, err := l.Allow(ctx, "partner:acme", 1) // the limit of partner:acme's rule
//
// A Limiter routes every call to the keyed limiter of the limit that
// applies to the key (by default a tokenbucket.Limiter for a rate and
// burst, a slidingwindow.Limiter for a limit per window), or, with
// WithQuotaAllower, to one shared limiter told the limit on each call
// (the Redis token buckets). It is itself a throttle.Limiter and a
// throttle.Reserver, so it goes wherever a limiter goes (the HTTP
// middleware, Wait, Wrap).
//
// # Document
//
//	{
//	  "default": {"rate": "10/s", "burst": 20},
//	  "tiers": {
//	    "free": {"rate": "1/s", "burst": 5},
//	    "pro":  {"limit": 10000, "window": "1h"}
//	  },
//	  "rules": [
//	    {"key": "acme", "tier": "pro"},
//	    {"prefix": "internal:", "rate": "1000/s", "burst": 1000},
//	    {"pattern": "batch-*-nightly", "limit": 5, "window": "1m"}
//	  ],
//	  "allow": {"keys": ["healthcheck"], "prefixes": ["ops:"]},
//	  "deny":  {"keys": ["abuser"], "patterns": ["scraper-?-*"]}
//	}
//
// A limit is one of: a token bucket, "rate" (as throttle.ParseRate reads
// it: "100/s", "5/1m", "1/6s", "86400/day") with "burst" (a positive
// integer); a window, "limit" units per "window" (a Go duration: "1m",
// "1h30m"); or "tier", the name of a tier whose limit applies. "default"
// is required; "tiers", "rules", "allow" and "deny" are optional. A rule
// matches with exactly one of "key" (the whole key), "prefix" (the key's
// beginning) or "pattern" (a glob: '*' any run of characters,
// '?' one character). The allow and deny lists take "keys", "prefixes"
// and "patterns" alike.
//
// For a key, the deny list is checked first, then the allow list, then
// the rules: an exact key wins, then the prefix or pattern with the most
// literal bytes (a prefix before a pattern of the same count, and patterns
// of the same count in the order listed). A key no rule matches gets the
// tier named by WithTierFunc (or WithTierMap), else the default.
//
// The parser is strict, so that a typo never becomes a silent default:
// unknown fields, a field, tier, key, prefix or pattern given twice, a
// limit stated in no form or in two, a bad rate or window, an unknown tier
// and trailing data are rejected with an error wrapping
// throttle.ErrInvalid that says where.
//
// # Reloading
//
// Open reads a file; Reload reads it again on demand (on SIGHUP, say) and
// Watch whenever its content changes and has read the same for one
// interval, so a file caught half written is not acted on. A version that does not parse or
// build is rejected as a whole and the rules in force stay; the error goes
// to WithErrorFunc and to WithObserver as a throttle.EventWarning. When a
// rule's limit changes, its limiter is adjusted in place (SetRate and
// SetBurst, or SetLimit for a window of the same length), so what each key
// has used is kept; a limit that changes form or window length, a window
// limit raised past its limiter's Capacity, or a limiter without those
// methods, is rebuilt empty.
//
// # Sources
//
// A Source delivers the document from elsewhere than a local file: a
// config service (HTTPSource: a conditional GET with If-None-Match, so an
// unchanged document costs a 304, and a bounded body) or a key of a store
// (the rulesetcd module watches an etcd key). OpenSource starts a Limiter
// on its document; Refresh fetches it once, Follow keeps following it
// (polling every interval, or as a Watcher delivers changes). Each
// Document has a Version (an ETag, a revision, a hash); an unchanged
// Version is not reloaded, and Limiter.Version names the one in force. A
// failed fetch (an error wrapping throttle.ErrUnavailable) or a document
// the strict parser refuses (throttle.ErrInvalid) is rejected like a bad
// file: the rules in force stay, and the error goes to WithErrorFunc
// and WithObserver. Fetches run outside the decision path: a hanging
// service delays only the fetch, which the timeout given to Refresh ends.
//
// Cached(src, path) keeps the last document that parsed in a file and,
// when the service is down at start-up or delivers a document that does
// not parse, starts from it. Follow the cached source, so that the file
// keeps up.
package rules
