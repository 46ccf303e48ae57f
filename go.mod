module rain

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/bits-and-blooms/bloom/v3 v3.7.1
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.24.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.2 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
