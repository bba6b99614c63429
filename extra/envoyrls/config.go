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

// Unit is the period of a rate_limit, as the RLS API numbers it.
type Unit int32

// Units, numbered as envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{
	"SECOND": UnitSecond, "MINUTE": UnitMinute, "HOUR": UnitHour, "DAY": UnitDay,
	"WEEK": UnitWeek, "MONTH": UnitMonth, "YEAR": UnitYear,
}

// Seconds is the length of the unit in seconds (a month is 30 days, a
// year 365), 0 for an unknown unit.
func (u Unit) Seconds() int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 3600
	case UnitDay:
		return 86400
	case UnitWeek:
		return 7 * 86400
	case UnitMonth:
		return 30 * 86400
	case UnitYear:
		return 365 * 86400
	}
	return 0
}

// Period is the unit as a duration.
func (u Unit) Period() time.Duration { return time.Duration(u.Seconds()) * time.Second }

// Algorithm selects how a rule counts. The zero value is FixedWindow, the
// reference service's algorithm.
type Algorithm uint8

// Algorithms a rule's rate_limit may name in its optional "algorithm" key.
const (
	// FixedWindow counts per unit, windows aligned to the Unix epoch,
	// charging every hit, admitted or not (as INCRBY does): the
	// reference's behaviour, decision for decision. Up to twice the limit
	// can pass across a window edge.
	FixedWindow Algorithm = iota
	// TokenBucket is GCRA: requests_per_unit per unit, burst at most
	// (default requests_per_unit); rejected hits are not charged.
	TokenBucket
	// SlidingWindow weighs the previous window's count by its overlap
	// with the sliding window (package slidingwindow): at most the limit
	// per aligned window, 2·limit-1 over a window length in the worst
	// case.
	SlidingWindow
	// SlidingLog keeps every admitted hit's time: exact over any window
	// of one unit (package slidinglog).
	SlidingLog
)

var algorithmNames = map[string]Algorithm{
	"fixed_window": FixedWindow, "token_bucket": TokenBucket, "gcra": TokenBucket,
	"sliding_window": SlidingWindow, "sliding_log": SlidingLog,
}

// String is the configuration name of the algorithm.
func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	case SlidingWindow:
		return "sliding_window"
	case SlidingLog:
		return "sliding_log"
	}
	return "fixed_window"
}

// RateLimit is one rule's limit. It is immutable once loaded.
type RateLimit struct {
	// Key is the rule's full key, "domain.key_value.key2", the name its
	// metrics are reported under.
	Key             string
	Name            string
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	ShadowMode      bool
	QuotaMode       bool
	DetailedMetric  bool
	Replaces        []string
	Algorithm       Algorithm
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
	limit          *RateLimit
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

// File is one configuration file's name and content.
type File struct {
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

// Parse builds a configuration from files, in order. Any error (wrapping
// ErrInvalidConfig) names the file and the line; then nothing is built.
func Parse(files []File, o LoadOptions) (*Config, error) {
	c := &Config{domains: map[string]*descriptor{}}
	for _, f := range files {
		if err := c.load(f, o); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ReadFiles reads path: a file, or every regular file of a directory
// and its subdirectories whose name does not start with a dot, sorted
// by path (the reference loads every file of its runtime directory).
func ReadFiles(path string) ([]File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		b, err := os.ReadFile(path)
		return []File{{Name: path, Data: b}}, err
	}
	var files []File
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
		files = append(files, File{Name: p, Data: b})
		return err
	})
	return files, err
}

// Load reads and parses path (see ReadFiles and Parse).
func Load(path string, o LoadOptions) (*Config, error) {
	files, err := ReadFiles(path)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	return Parse(files, o)
}

// ConfigError is a refused configuration file: its name, the line, and
// why. It wraps ErrInvalidConfig.
type ConfigError struct {
	File   string
	Line   int
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("envoyrls: %s:%d: %s", e.File, e.Line, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

func configError(file string, line int, format string, a ...any) error {
	return &ConfigError{File: file, Line: line, Reason: fmt.Sprintf(format, a...)}
}
