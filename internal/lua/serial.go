package lua

// This file is the serial scripts: the counter grant serials come from and
// its watermark copies (internal/idgen).

import "context"

// ReserveSerials runs the serial script: the counter at key becomes
// max(counter, floor) + n, which it returns.
func ReserveSerials(ctx context.Context, c Client, key string, n, floor int64) (int64, error) {
	return serialScript.Run(ctx, c, []string{key}, n, floor).Int64()
}

// RaiseWatermark raises the watermark at key to at least v and returns it.
func RaiseWatermark(ctx context.Context, c Client, key string, v int64) (int64, error) {
	return watermarkScript.Run(ctx, c, []string{key}, v).Int64()
}
