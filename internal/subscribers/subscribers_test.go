package subscribers

import (
	"slices"
	"testing"
)

func TestEmitInOrderUntilStop(t *testing.T) {
	var l List[int]
	var got []string
	stopA := l.Subscribe(func(e int) { got = append(got, "a"+string(rune('0'+e))) })
	l.Subscribe(func(e int) { got = append(got, "b"+string(rune('0'+e))) })
	l.Emit(1)
	stopA()
	l.Emit(2)
	if want := []string{"a1", "b1", "b2"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
