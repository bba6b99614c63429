package optkit_test

import (
	"errors"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/optkit"
)

type option func(*[]int)

func TestApply(t *testing.T) {
	var got []int
	add := func(i int) option { return func(c *[]int) { *c = append(*c, i) } }
	if err := optkit.Apply(&got, "pkg", []option{add(1), add(2)}); err != nil || len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("Apply = %v, %v; want [1 2] in order, nil", got, err)
	}
	err := optkit.Apply(&got, "pkg", []option{add(3), nil, add(4)})
	if !errors.Is(err, throttle.ErrInvalid) || err.Error() != "throttle: invalid argument: pkg: nil Option" {
		t.Fatalf("Apply with a nil option: %v, want ErrInvalid naming pkg", err)
	}
	if len(got) != 3 {
		t.Fatalf("Apply went on past the nil option: %v", got)
	}
}
