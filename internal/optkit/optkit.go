// Package optkit applies functional options the way every constructor of
// the module does.
package optkit

import (
	"fmt"

	"github.com/throttlekit/throttle"
)

// Apply calls opts on c in order. A nil option stops it with an error
// wrapping throttle.ErrInvalid that names pkg.
func Apply[C any, O ~func(*C)](c *C, pkg string, opts []O) error {
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: %s: nil Option", throttle.ErrInvalid, pkg)
		}
		o(c)
	}
	return nil
}
