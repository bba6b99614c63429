package limiterkit_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/throttletest"
)

func TestNewSettings(t *testing.T) {
	s, err := limiterkit.NewSettings()
	if err != nil || s.Clock != nil || s.MaxKeys != limiterkit.DefaultMaxKeys || s.MaxKeyLen != limiterkit.DefaultMaxKeyLen {
		t.Fatalf("defaults = %+v, %v", s, err)
	}
	clk := throttletest.NewClock()
	s, err = limiterkit.NewSettings(throttle.WithClock(clk), throttle.WithMaxKeys(10), throttle.WithMaxKeyLen(8),
		throttle.WithSweepInterval(time.Second))
	if err != nil || s.Clock != clk || s.MaxKeys != 10 || s.MaxKeyLen != 8 || s.SweepInterval != time.Second {
		t.Fatalf("with options = %+v, %v", s, err)
	}
	for name, o := range map[string]throttle.Option{
		"nil clock":      throttle.WithClock(nil),
		"zero keys":      throttle.WithMaxKeys(0),
		"negative len":   throttle.WithMaxKeyLen(-1),
		"negative sweep": throttle.WithSweepInterval(-time.Second),
		"nil option":     nil,
	} {
		if _, err := limiterkit.NewSettings(o); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestCheckKeyAndN(t *testing.T) {
	s, _ := limiterkit.NewSettings(throttle.WithMaxKeyLen(4))
	if s.CheckKey("abcd") != nil {
		t.Error("a key of MaxKeyLen bytes was rejected")
	}
	for _, k := range []string{"", "abcde", strings.Repeat("x", 1<<20)} {
		if err := s.CheckKey(k); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("CheckKey(%d bytes) = %v, want ErrInvalid", len(k), err)
		}
	}
	if limiterkit.CheckN(3, 3) != nil {
		t.Error("CheckN(3, 3) rejected n == limit")
	}
	if err := limiterkit.CheckN(0, 3); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("CheckN(0) = %v", err)
	}
	if err := limiterkit.CheckN(4, 3); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("CheckN(4, 3) = %v", err)
	}
}

func TestClock(t *testing.T) {
	c := throttletest.NewClock()
	if !c.Now().Equal(throttletest.Epoch) {
		t.Fatalf("NewClock().Now() = %v", c.Now())
	}
	c.Advance(1500 * time.Millisecond)
	if got := c.Now().Sub(throttletest.Epoch); got != 1500*time.Millisecond {
		t.Fatalf("after Advance: %v", got)
	}
}
