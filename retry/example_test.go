package retry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/retry"
)

// Retry a call that fails for overload, with back-off and a budget
// shared by every caller of the backend.
func ExampleDo() {
	budget, err := retry.NewBudget(10, 0.1)
	if err != nil {
		panic(err)
	}
	p := &retry.Policy{MaxAttempts: 3, BaseDelay: time.Millisecond, Budget: budget}
	calls := 0
	v, err := retry.Do(context.Background(), p, func(context.Context) (string, error) {
		if calls++; calls < 3 {
			return "", throttle.ErrUnavailable
		}
		return "ok", nil
	})
	fmt.Println(v, err, calls)
	// Output: ok <nil> 3
}

// A budget of 10 tokens grants retries while more than 5 are left: in an
// outage, 4 retries in all, however many callers share it.
func ExampleBudget() {
	budget, err := retry.NewBudget(10, 0.1)
	if err != nil {
		panic(err)
	}
	p := &retry.Policy{MaxAttempts: 100, Budget: budget}
	granted := 0
	for range 100 {
		if _, ok := p.Next(1, 0); ok {
			granted++
		}
	}
	fmt.Println("retries granted:", granted)
	// Output: retries granted: 4
}

func ExamplePolicy_Backoff() {
	p := &retry.Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, Rand: func() float64 { return 0.5 }}
	for i := 1; i <= 5; i++ {
		fmt.Println(p.Backoff(i))
	}
	// Output:
	// 50ms
	// 100ms
	// 200ms
	// 400ms
	// 500ms
}
