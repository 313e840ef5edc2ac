// Go calls of a probed function while the runtime moves the goroutine's stack, for the
// `func:main.slow>DURATION` latency tests: a return probe that rewrites the return address
// (uretprobe) makes the runtime's stack copier and unwinder abort ("unexpected return
// pc"); probes on the function's own RETs must not.
// Build: CGO_ENABLED=0 GO111MODULE=off go build -o slow main.go
//
//	slow CALLS_PER_GOROUTINE THRESHOLD_US [HOW HOLD_MS]
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
//
// With HOW and HOLD_MS (the in-flight tests), the slow calls (i % 25 == 5) first recurse
// 400 levels, deeper than any call before them, so that the runtime copies the stack
// after slow's entry, then hold HOLD_MS: HOW = busy (a loop on the CPU, preempted by the
// runtime and moved between threads), nanosleep (in a nanosleep syscall, on its thread)
// or park (time.Sleep: parked, on no thread); HOW = sibling: slow never holds nor spins, and on the
// slow calls' turn the goroutine calls main.sibling (which holds in nanosleep) right after
// slow returns, through the same call instruction, at the same stack height. Each call
// is also printed as
//
//	call=GOROUTINE START_NS DURATION_NS   (CLOCK_MONOTONIC before the call, its length)
//
// and held_moved=N counts the held calls whose frame moved.
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

var moves, switches, heldMoved [goroutines]int64

// how and hold: the in-flight mode (HOW, HOLD_MS); "" = the default spin.
var how string
var hold time.Duration

// sink keeps the busy loop's work.
var sink [goroutines]uint64

// monotonic is CLOCK_MONOTONIC in ns (the clock of the kernel's timestamps).
func monotonic() uint64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// holdFor holds the call d as HOW says.
//
//go:noinline
func holdFor(g int, d time.Duration) {
	start := monotonic()
	until := start + uint64(d)
	switch how {
	case "busy":
		x := uint64(g)
		for monotonic() < until {
			for k := 0; k < 200000; k++ {
				x = x*6364136223846793005 + uint64(k)
			}
		}
		sink[g] += x
	case "nanosleep", "sibling":
		for now := monotonic(); now < until; now = monotonic() {
			left := until - now
			ts := syscall.Timespec{Sec: int64(left / 1e9), Nsec: int64(left % 1e9)}
			syscall.Nanosleep(&ts, nil)
		}
	default:
		time.Sleep(d)
	}
}

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
	held := how != "" && how != "sibling" && i%25 == 5
	if held {
		depth = 400
	}
	r := grow(depth, uint64(g)<<32|uint64(i))
	if uintptr(unsafe.Pointer(&marker)) != before {
		moves[g]++
		if held {
			heldMoved[g]++
		}
	}
	if i%25 == 5 && how != "sibling" {
		if held {
			holdFor(g, hold)
		} else {
			spin(spinFor)
		}
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

// sibling is called right after slow from the same call instruction (HOW = sibling): it
// moves the stack as slow's held calls do, then holds in nanosleep.
//
//go:noinline
func sibling(g, i int) uint64 {
	r := grow(400, uint64(g)<<32|uint64(i))
	holdFor(g, hold)
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
	if len(os.Args) != 3 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: slow CALLS_PER_GOROUTINE THRESHOLD_US [HOW HOLD_MS]")
		os.Exit(2)
	}
	if len(os.Args) == 5 {
		how = os.Args[3]
		ms, err := strconv.Atoi(os.Args[4])
		if err != nil || (how != "busy" && how != "nanosleep" && how != "park" && how != "sibling") {
			fmt.Fprintln(os.Stderr, "HOW: busy, nanosleep, park or sibling; HOLD_MS: a number")
			os.Exit(2)
		}
		hold = time.Duration(ms) * time.Millisecond
	}
	var lines [goroutines][]string
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
				began := uint64(0)
				if how != "" {
					began = monotonic()
				}
				// One call instruction for slow and, on sibling's turn, main.sibling.
				fns := [2]func(int, int) uint64{slow, sibling}
				n := 1
				if how == "sibling" && i%25 == 5 {
					n = 2
				}
				var r uint64
				for k := 0; k < n; k++ {
					r += fns[k](g, i)
				}
				if how != "" {
					took := monotonic() - began
					lines[g] = append(lines[g], fmt.Sprintf("call=%d %d %d", g, began, took))
				}
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
	var slowTotal, spunTotal, movesTotal, switchesTotal, heldMovedTotal int64
	var result uint64
	for g := 0; g < goroutines; g++ {
		for _, line := range lines[g] {
			fmt.Println(line)
		}
		heldMovedTotal += heldMoved[g]
		slowTotal += int64(slows[g])
		spunTotal += int64(spun[g])
		movesTotal += moves[g]
		switchesTotal += switches[g]
		result = result*31 + sums[g]
	}
	fmt.Printf("measured_slow=%d\nslow_calls=%d\nstack_moves=%d\nthread_switches=%d\nresult=%d\n",
		slowTotal, spunTotal, movesTotal, switchesTotal, result)
	if how != "" {
		fmt.Printf("held_moved=%d\n", heldMovedTotal)
	}
	if movesTotal == 0 && calls > 0 {
		os.Exit(3)
	}
}
