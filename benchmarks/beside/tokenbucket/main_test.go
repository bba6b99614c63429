package tokenbucket_test

import "context"

var bg = context.Background()
