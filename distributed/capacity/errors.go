package capacity

import (
	"errors"
	"fmt"

	"github.com/throttlekit/throttle"
)

// ErrExhausted reports that a server holds as many clients or resources
// as it is configured to: the request was refused, nothing was granted.
// Retrying later, or elsewhere, may help.
var ErrExhausted = errors.New("capacity: server at its bound of clients or resources")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: capacity: %s", throttle.ErrInvalid, fmt.Sprintf(format, args...))
}
