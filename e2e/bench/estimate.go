package main

// estimate.go follows the operation as a script would (status --watch -o
// json) and holds the time left it estimated against the time actually left.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// EstimateSample is the time left that `kubectl ichor status --watch -o
// json` estimated at one moment of the upgrade, against the time that was
// actually left (until the upgrade command's end).
type EstimateSample struct {
	// At is the fraction of the upgrade's wall time (0.25, 0.5, 0.75).
	At              float64 `json:"at"`
	EstimateSeconds float64 `json:"estimateSeconds"`
	ActualSeconds   float64 `json:"actualSeconds"`
	// ErrorPercent is (estimate - actual) / actual, in percent.
	ErrorPercent float64 `json:"errorPercent"`
}

// targetEstimate is how close the estimate should be to the time left (the
// issue's goal, reported, never asserted).
const targetEstimate = 25.0

// estimateWatch follows the operation with `status --watch -o json` as a
// script would, and keeps every estimate of the time left with when it was
// printed.
type estimateWatch struct {
	mu     sync.Mutex
	points []estimatePoint
}

type estimatePoint struct {
	at   time.Time
	left float64
}

// run follows until ctx ends, starting again while there is no operation
// yet (the upgrade command is still planning).
func (w *estimateWatch) run(ctx context.Context, plugin string, env []string, kubeconfig string) {
	for ctx.Err() == nil {
		cmd := exec.CommandContext(ctx, plugin, "status", "--watch", "-o", "json", "--kubeconfig", kubeconfig)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

		out, err := cmd.StdoutPipe()
		if err != nil || cmd.Start() != nil {
			return
		}

		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)

		for sc.Scan() {
			var doc struct {
				Progress struct {
					RemainingSeconds *float64 `json:"remainingSeconds"`
				} `json:"progress"`
			}

			if json.Unmarshal(sc.Bytes(), &doc) == nil && doc.Progress.RemainingSeconds != nil {
				w.mu.Lock()
				w.points = append(w.points, estimatePoint{at: time.Now(), left: *doc.Progress.RemainingSeconds})
				w.mu.Unlock()
			}
		}

		if cmd.Wait() == nil {
			return // the operation ended
		}

		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// samples are the last estimates printed before a quarter, half and three
// quarters of the upgrade's wall time, against the time then left.
func (w *estimateWatch) samples(began, ended time.Time) []EstimateSample {
	w.mu.Lock()
	defer w.mu.Unlock()

	var out []EstimateSample

	wall := ended.Sub(began)

	for _, f := range []float64{0.25, 0.5, 0.75} {
		at := began.Add(time.Duration(f * float64(wall)))

		var last *estimatePoint

		for i := range w.points {
			if !w.points[i].at.After(at) {
				last = &w.points[i]
			}
		}

		if last == nil {
			continue
		}

		// The estimate printed at last.at, aged to the sample's moment.
		est := math.Max(0, last.left-at.Sub(last.at).Seconds())
		actual := ended.Sub(at).Seconds()

		out = append(out, EstimateSample{At: f, EstimateSeconds: round(est), ActualSeconds: round(actual), ErrorPercent: round(100 * (est - actual) / actual)})
	}

	return out
}

func estimateVerdict(r UpgradeResult) string {
	if len(r.Estimates) == 0 {
		return fmt.Sprintf("%s: estimate of the time left within %.0f%%: not judged, no estimate was printed", runLabel(r), targetEstimate)
	}

	worst, at := 0.0, ""

	for _, s := range r.Estimates {
		if math.Abs(s.ErrorPercent) >= math.Abs(worst) {
			worst = s.ErrorPercent
			at = fmt.Sprintf("%.0f%% in: %.0fs estimated, %.0fs left", 100*s.At, s.EstimateSeconds, s.ActualSeconds)
		}
	}

	verdict := "met"
	if math.Abs(worst) > targetEstimate {
		verdict = "NOT met"
	}

	return fmt.Sprintf("%s: estimate of the time left within %.0f%% (at a quarter, half, three quarters): %s (worst %+.0f%%, %s)",
		runLabel(r), targetEstimate, verdict, worst, at)
}
