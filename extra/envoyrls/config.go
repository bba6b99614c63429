package envoyrls

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
)

// ErrInvalidConfig is wrapped by every error that refuses a rate-limit
// configuration file; it wraps throttle.ErrInvalid.
var ErrInvalidConfig = fmt.Errorf("envoyrls: invalid configuration: %w", throttle.ErrInvalid)

// rlUnit is the period of a rate_limit, as the RLS API numbers it.
type rlUnit int32

// Units, numbered as envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
const (
	unitUnknown rlUnit = 0
	unitSecond  rlUnit = 1
	unitMinute  rlUnit = 2
	unitHour    rlUnit = 3
	unitDay     rlUnit = 4
	unitMonth   rlUnit = 5
	unitYear    rlUnit = 6
	unitWeek    rlUnit = 7
)

var unitNames = map[string]rlUnit{
	"SECOND": unitSecond, "MINUTE": unitMinute, "HOUR": unitHour, "DAY": unitDay,
	"WEEK": unitWeek, "MONTH": unitMonth, "YEAR": unitYear,
}

// Seconds is the length of the unit in seconds (a month is 30 days, a
// year 365), 0 for an unknown unit.
func (u rlUnit) Seconds() int64 {
	switch u {
	case unitSecond:
		return 1
	case unitMinute:
		return 60
	case unitHour:
		return 3600
	case unitDay:
		return 86400
	case unitWeek:
		return 7 * 86400
	case unitMonth:
		return 30 * 86400
	case unitYear:
		return 365 * 86400
	}
	return 0
}

// Period is the unit as a duration.
func (u rlUnit) Period() time.Duration { return time.Duration(u.Seconds()) * time.Second }

// algorithm selects how a rule counts. The zero value is fixedWindow, the
// reference service's algorithm.
type algorithm uint8

// Algorithms a rule's rate_limit may name in its optional "algorithm" key.
const (
	// fixedWindow counts per unit, windows aligned to the Unix epoch,
	// charging every hit, admitted or not (as INCRBY does): the
	// reference's behaviour, decision for decision. Up to twice the limit
	// can pass across a window edge.
	fixedWindow algorithm = iota
	// tokenBucket is GCRA: requests_per_unit per unit, burst at most
	// (default requests_per_unit); rejected hits are not charged.
	tokenBucket
	// slidingWindow weighs the previous window's count by its overlap
	// with the sliding window (package slidingwindow): at most the limit
	// per aligned window, 2·limit-1 over a window length in the worst
	// case.
	slidingWindow
	// slidingLog keeps every admitted hit's time: exact over any window
	// of one unit (package slidinglog).
	slidingLog
)

var algorithmNames = map[string]algorithm{
	"fixed_window": fixedWindow, "token_bucket": tokenBucket, "gcra": tokenBucket,
	"sliding_window": slidingWindow, "sliding_log": slidingLog,
}

// String is the configuration name of the algorithm.
func (a algorithm) String() string {
	switch a {
	case tokenBucket:
		return "token_bucket"
	case slidingWindow:
		return "sliding_window"
	case slidingLog:
		return "sliding_log"
	}
	return "fixed_window"
}

// limitRule is one rule's limit. It is immutable once loaded.
type limitRule struct {
	// Key is the rule's full key, "domain.key_value.key2", the name its
	// metrics are reported under.
	Key             string
	Name            string
	rlUnit          rlUnit
	RequestsPerUnit uint32
	Unlimited       bool
	ShadowMode      bool
	QuotaMode       bool
	DetailedMetric  bool
	Replaces        []string
	algorithm       algorithm
	// Burst is the token bucket's capacity (0: RequestsPerUnit).
	Burst uint32
}

// wildcard is a descriptor key with '*' in its value, split on '*'.
type wildcard struct {
	key   string
	parts []string
}

// descriptor is one level of the tree of a domain's descriptors.
type descriptor struct {
	children       map[string]*descriptor
	wildcards      []wildcard // in the order of the file
	limit          *limitRule
	valueToMetric  bool
	shareThreshold bool
	pattern        string // the wildcard key, when shareThreshold
}

// Config is a loaded set of domains. It is immutable and safe for
// concurrent use; the zero value has no domain.
type Config struct {
	domains map[string]*descriptor
	rules   int
}

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// Rules is the number of rate_limit entries loaded.
func (c *Config) Rules() int { return c.rules }

// configFile is one configuration file's name and content.
type configFile struct {
	Name string
	Data []byte
}

// LoadOptions change how files are combined.
type LoadOptions struct {
	// MergeDomains lets several files configure one domain, their
	// descriptors merged (a key given twice is still refused). Without
	// it, as the reference's default, a domain in two files is refused.
	MergeDomains bool
}

// parse builds a configuration from files, in order. Any error (wrapping
// ErrInvalidConfig) names the file and the line; then nothing is built.
func parse(files []configFile, o LoadOptions) (*Config, error) {
	c := &Config{domains: map[string]*descriptor{}}
	for _, f := range files {
		if err := c.load(f, o); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// readFiles reads path: a file, or every regular file of a directory
// and its subdirectories whose name does not start with a dot, sorted
// by path (the reference loads every file of its runtime directory).
func readFiles(path string) ([]configFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		b, err := os.ReadFile(path)
		return []configFile{{Name: path, Data: b}}, err
	}
	var files []configFile
	err = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != path {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		files = append(files, configFile{Name: p, Data: b})
		return err
	})
	return files, err
}

// Load reads and parses path (see readFiles and parse).
func Load(path string, o LoadOptions) (*Config, error) {
	files, err := readFiles(path)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	return parse(files, o)
}

// ConfigError is a refused configuration file: its name, the line, and
// why. It wraps ErrInvalidConfig.
type ConfigError struct {
	configFile string
	Line       int
	Reason     string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("envoyrls: %s:%d: %s", e.configFile, e.Line, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

func configError(file string, line int, format string, a ...any) error {
	return &ConfigError{configFile: file, Line: line, Reason: fmt.Sprintf(format, a...)}
}
