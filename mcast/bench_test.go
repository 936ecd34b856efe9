package mcast_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/softrdma/softrdma/mcast"
)

// BenchmarkStream: one sender, one receiver on lo, in one process:
// messages per second through the whole reliable path (fragmenting,
// window, acks), messages of 64 B, 1 KiB and 64 KiB.
func BenchmarkStream(b *testing.B) { benchStream(b, 1) }

// BenchmarkStreamBatch is BenchmarkStream with SendBatch of 64 messages.
func BenchmarkStreamBatch(b *testing.B) { benchStream(b, 64) }

func benchStream(b *testing.B, batch int) {
	for _, size := range []int{64, 1024, 64 << 10} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			group := randomGroup()
			snd, err := mcast.Join(ctx, group, &mcast.Options{Local: lo})
			if err != nil {
				b.Fatal(err)
			}
			defer snd.Close()
			rcv, err := mcast.Join(ctx, group, &mcast.Options{Local: lo})
			if err != nil {
				b.Fatal(err)
			}
			defer rcv.Close()
			if err := snd.WaitReceivers(ctx, 1); err != nil {
				b.Fatal(err)
			}
			msgs := make([][]byte, batch)
			for i := range msgs {
				msgs[i] = make([]byte, size)
			}
			done := make(chan error, 1)
			b.SetBytes(int64(size))
			b.ResetTimer()
			go func() {
				buf := make([]byte, size)
				for range b.N {
					if _, _, err := rcv.Receive(ctx, buf); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for i := 0; i < b.N; i += batch {
				if _, err := snd.SendBatch(ctx, msgs[:min(batch, b.N-i)]); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			// Not the deferred Closes: the sender's may linger (up to
			// Options.Linger) for a receiver that closed first, which is
			// no part of the stream (b.N 1 once took 1 s of it).
			b.StopTimer()
		})
	}
}
