// Go calls of a probed function while the runtime moves the goroutine's stack, for the
// `func:main.slow>DURATION` latency tests: a return probe that rewrites the return address
// (uretprobe) makes the runtime's stack copier and unwinder abort ("unexpected return
// pc"); probes on the function's own RETs must not.
// Build: CGO_ENABLED=0 GO111MODULE=off go build -o slow main.go
//
//	slow CALLS_PER_GOROUTINE THRESHOLD_US
//
// 4 goroutines each call main.slow(g, i) for i = 0..CALLS_PER_GOROUTINE-1. Every call
// recurses 50-200 levels deep in grow (256-byte frames), past the goroutine's stack, so
// the runtime copies the stack while slow is on it; every 8th call a goroutine also runs
// runtime.GC(), which shrinks idle stacks so that they grow (and move) again. Calls with
// i % 25 == 5 then spin 20 ms (busy loop on time.Now, yielding); the others return at once. slow
// has several return statements. Each goroutine measures its calls itself; main prints:
//
//	measured_slow=N   calls that lasted more than THRESHOLD_US (all goroutines)
//	slow_calls=N      calls that spun
//	stack_moves=N     calls during which slow's own frame moved (varies run to run)
//	thread_switches=N calls that returned on another OS thread than they entered on
//	                  (goroutines migrate between threads; varies run to run)
//	result=CHECKSUM   a function of the return values only
//
// and exits 0 (2 on bad arguments, 3 when no stack moved at all).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const goroutines = 4
const spinFor = 20 * time.Millisecond

// grow recurses depth levels with a 256-byte array in every frame.
//
//go:noinline
func grow(depth int, seed uint64) uint64 {
	var buf [256]byte
	for k := range buf {
		buf[k] = byte(seed >> (k % 8))
	}
	if depth == 0 {
		return seed
	}
	r := grow(depth-1, seed*6364136223846793005+1442695040888963407)
	return r ^ uint64(buf[depth%256]) + uint64(buf[(depth*7)%256])
}

// spin busy-waits (never sleeps): the call stays on CPU. It yields to the scheduler on
// every turn, so that with fewer Ps than goroutines the others still run at once (their
// fast calls stay fast) instead of waiting for sysmon's 10 ms preemption.
//
//go:noinline
func spin(d time.Duration) {
	start := time.Now()
	for time.Since(start) < d {
		runtime.Gosched()
	}
}

var moves, switches [goroutines]int64

// left counts a call of slow that returns on another OS thread than it entered on.
func left(g, tid int) {
	if syscall.Gettid() != tid {
		switches[g]++
	}
}

// slow is the probed function: main.slow.
//
//go:noinline
func slow(g, i int) uint64 {
	tid := syscall.Gettid()
	var marker int
	before := uintptr(unsafe.Pointer(&marker))
	depth := 50 + (i*37+g*11)%151
	r := grow(depth, uint64(g)<<32|uint64(i))
	if uintptr(unsafe.Pointer(&marker)) != before {
		moves[g]++
	}
	if i%25 == 5 {
		spin(spinFor)
		left(g, tid)
		return r + 1
	}
	if i%3 == 0 {
		left(g, tid)
		return r ^ 0x5555
	}
	left(g, tid)
	return r
}

// Server and Counter give the name tests a pointer-receiver and a value-receiver method:
// main.(*Server).Handle is called 3 times and main.Counter.Value 2 times at start.
type Server struct{ hits int }

//go:noinline
func (s *Server) Handle(n int) int {
	s.hits += n
	return s.hits
}

type Counter int

//go:noinline
func (c Counter) Value() int { return int(c) * 3 }

func main() {
	srv := &Server{}
	warm := 0
	for i := 0; i < 3; i++ {
		warm += srv.Handle(i)
	}
	for i := 0; i < 2; i++ {
		warm += Counter(i).Value()
	}
	if warm < 0 {
		os.Exit(3)
	}
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: slow CALLS_PER_GOROUTINE THRESHOLD_US")
		os.Exit(2)
	}
	calls, err1 := strconv.Atoi(os.Args[1])
	thresholdUs, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "usage: slow CALLS_PER_GOROUTINE THRESHOLD_US")
		os.Exit(2)
	}
	threshold := time.Duration(thresholdUs) * time.Microsecond
	var sums, slows, spun [goroutines]uint64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				if i%8 == 0 {
					runtime.GC()
				}
				start := time.Now()
				r := slow(g, i)
				if time.Since(start) > threshold {
					slows[g]++
				}
				if i%25 == 5 {
					spun[g]++
				}
				sums[g] = sums[g]*1099511628211 + r
			}
		}(g)
	}
	wg.Wait()
	var slowTotal, spunTotal, movesTotal, switchesTotal int64
	var result uint64
	for g := 0; g < goroutines; g++ {
		slowTotal += int64(slows[g])
		spunTotal += int64(spun[g])
		movesTotal += moves[g]
		switchesTotal += switches[g]
		result = result*31 + sums[g]
	}
	fmt.Printf("measured_slow=%d\nslow_calls=%d\nstack_moves=%d\nthread_switches=%d\nresult=%d\n",
		slowTotal, spunTotal, movesTotal, switchesTotal, result)
	if movesTotal == 0 && calls > 0 {
		os.Exit(3)
	}
}
