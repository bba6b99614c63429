package redislimit

import (
	"context"
	"errors"

	"github.com/throttlekit/throttle"
)

type leaseConfig struct{}

type leaser struct{}

func (b *Bucket) initLease(*config) error { return nil }

func (l *leaser) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return throttle.Decision{}, nil
}

func errorsIsUnavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }
