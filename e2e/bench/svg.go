package main

// svg.go draws a Timeline as SVG, with the standard library alone: one row
// per node, a bar per step coloured by its stage, the steps on the critical
// path outlined, the critical path's waits drawn in red between them (those
// from 0.5 s labelled with their seconds), the bound's terms laid end to end
// on a row of their own, each stage's end marked across the rows. Every bar
// carries a <title>, so a browser shows what it was and when.

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"slices"
	"time"
)

// The picture's geometry, in pixels.
const (
	svgLabelW  = 130
	svgPlotW   = 1100
	svgRight   = 30
	svgTop     = 96
	svgRowH    = 16
	svgBarH    = 11
	svgLegendH = 64

	// minLabelledGap is the shortest wait on the critical path labelled with its
	// seconds; shorter ones are drawn, not labelled.
	minLabelledGap = 500 * time.Millisecond
	// minDrawnGap is the shortest wait drawn at all.
	minDrawnGap = 50 * time.Millisecond
)

// kindColors colour the bars: a stage and the components it moves alike
// (kubectl-ichor's stages, talosctl's components).
var kindColors = map[string]string{
	"APIServers": "#4e79a7", "kube-apiserver": "#4e79a7",
	"ControlPlaneComponents": "#f28e2b", "kube-controller-manager": "#f28e2b", "kube-scheduler": "#ffbe7d",
	"KubeProxy": "#76b7b2", kindKubeProxyPod: "#59a14f", "kube-proxy": "#59a14f",
	"Kubelets": "#e15759", "kubelet": "#e15759",
	kindRunner: "#bab0ac", kindPrePull: "#edc948", kindManifests: "#b07aa1",
}

func kindColor(kind string) string {
	if c, ok := kindColors[kind]; ok {
		return c
	}

	return "#9c755f"
}

// svgTimeline draws t.
func svgTimeline(t Timeline) []byte {
	end := t.End
	if !end.After(t.Start) {
		end = t.Start.Add(time.Second)
	}

	span := end.Sub(t.Start).Seconds()
	x := func(at time.Time) float64 {
		return svgLabelW + math.Max(0, math.Min(svgPlotW, at.Sub(t.Start).Seconds()/span*svgPlotW))
	}

	rows := slices.Clone(t.Rows)
	if t.Bound != nil {
		rows = append([]string{"bound"}, rows...)
	}

	rowIndex := map[string]int{}
	for i, r := range rows {
		rowIndex[r] = i
	}

	y := func(row string) float64 { return float64(svgTop + rowIndex[row]*svgRowH) }
	width := svgLabelW + svgPlotW + svgRight
	height := svgTop + len(rows)*svgRowH + svgLegendH

	var b bytes.Buffer

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", esc(t.Title))
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#444">%s</text>`+"\n", esc(t.Subtitle))

	// Rows: a faint band every other row, the row's name on the left.
	for i, r := range rows {
		if i%2 == 1 {
			fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%d" height="%d" fill="#f4f4f4"/>`+"\n", svgLabelW, y(r), svgPlotW, svgRowH)
		}

		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", svgLabelW-6, y(r)+svgBarH, esc(r))
	}

	// The axis: a tick every step seconds, a grid line under each.
	step := tickStep(span)
	bottom := float64(svgTop + len(rows)*svgRowH)

	for s := 0.0; s <= span+1e-9; s += step {
		at := t.Start.Add(time.Duration(s * float64(time.Second)))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", x(at), svgTop-4, x(at), bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%gs</text>`+"\n", x(at), svgTop-8, s)
	}

	// The bound's terms end to end: where the run would be on its
	// critical path alone.
	if t.Bound != nil {
		at := t.Start
		for _, term := range t.Bound.Terms {
			to := at.Add(time.Duration(term.Seconds * float64(time.Second)))
			fmt.Fprintf(&b, `<rect class="bound" x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s" fill-opacity="0.45" stroke="#ffffff" stroke-width="0.5"><title>%s</title></rect>`+"\n",
				x(at), y("bound")+2, math.Max(0.5, x(to)-x(at)), svgBarH, kindColor(term.Stage),
				esc(fmt.Sprintf("bound: %d x %.2fs = %.2fs %s: %s", term.Count, term.Each, term.Seconds, term.Stage, term.What)))
			at = to
		}
	}

	// The steps: the critical path's outlined, the others paler.
	for _, s := range t.Steps {
		if _, ok := rowIndex[s.Row]; !ok {
			continue
		}

		class, style := "step", `fill-opacity="0.45"`
		if s.Critical {
			class, style = "step critical", `stroke="#222222" stroke-width="0.8"`
		}

		if s.Kind == kindRunner {
			style = `stroke="#ffffff" stroke-width="1"`
		}

		w := math.Max(1, x(s.To)-x(s.From))
		fmt.Fprintf(&b, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s" %s><title>%s</title></rect>`+"\n",
			class, x(s.From), y(s.Row)+2, w, svgBarH, kindColor(s.Kind), style,
			esc(fmt.Sprintf("%s (%.2fs)", s.Label, s.To.Sub(s.From).Seconds())))

		if s.Text != "" && w > 6.5*float64(len(s.Text)) {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="9" fill="#222">%s</text>`+"\n", x(s.From)+3, y(s.Row)+svgBarH, esc(s.Text))
		}
	}

	// The critical path's waits, each labelled over its middle (on a white
	// halo, so that it reads over the bars), with a note when a new runner
	// took over in it.
	for _, g := range criticalGaps(t.Steps, rowIndex) {
		y0, y1 := y(g.fromRow)+2+svgBarH/2, y(g.toRow)+2+svgBarH/2
		note := ""
		if newRunnerIn(t.Steps, g) {
			note = " (a new runner took over)"
		}

		fmt.Fprintf(&b, `<path class="gap" d="M%.1f %.1f H%.1f V%.1f" fill="none" stroke="#d62728" stroke-width="1.5"><title>%s</title></path>`+"\n",
			x(g.from), y0, x(g.to), y1, esc(fmt.Sprintf("waiting %.2fs: %s to %s%s", g.to.Sub(g.from).Seconds(), g.fromRow, g.toRow, note)))

		if g.to.Sub(g.from) >= minLabelledGap {
			label := fmt.Sprintf("%.2fs%s", g.to.Sub(g.from).Seconds(), note)
			mid := math.Max(svgLabelW+40, math.Min(svgLabelW+svgPlotW-3.2*float64(len(label)), (x(g.from)+x(g.to))/2))
			fmt.Fprintf(&b, `<text class="gap-label" x="%.1f" y="%.1f" text-anchor="middle" fill="#d62728" font-weight="bold" stroke="#ffffff" stroke-width="3" paint-order="stroke">%s</text>`+"\n",
				mid, y0-2, esc(label))
		}
	}

	// Each stage's end, across the rows; the names alternate between two
	// lines so that close ends stay readable.
	for i, m := range t.Marks {
		ty := 56 + (i%2)*12
		fmt.Fprintf(&b, `<line class="mark" x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#555555" stroke-dasharray="3,3"/>`+"\n", x(m.At), ty+2, x(m.At), bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" fill="#555">%s done %s</text>`+"\n",
			x(m.At)-2, ty, esc(m.Label), offset(t.Start, m.At))
	}

	legend(&b, t, bottom+22)
	b.WriteString("</svg>\n")

	return b.Bytes()
}

// legend lists the kinds drawn, then how the critical path reads.
func legend(b *bytes.Buffer, t Timeline, top float64) {
	var kinds []string

	if t.Bound != nil {
		for _, term := range t.Bound.Terms {
			if !slices.Contains(kinds, term.Stage) {
				kinds = append(kinds, term.Stage)
			}
		}
	}

	for _, s := range t.Steps {
		if !slices.Contains(kinds, s.Kind) {
			kinds = append(kinds, s.Kind)
		}
	}

	left := float64(svgLabelW)
	for _, k := range kinds {
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="12" height="10" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", left, top, kindColor(k), left+16, top+9, esc(k))
		left += 24 + 6.5*float64(len(k))
	}

	fmt.Fprintf(b, `<text x="%d" y="%.1f" fill="#444">Outlined: on the critical path. Red: the critical path waiting (labelled from %s). Pale: off it.%s</text>`+"\n",
		svgLabelW, top+28, minLabelledGap, boundNote(t))
}

func boundNote(t Timeline) string {
	if t.Bound == nil {
		return ""
	}

	return fmt.Sprintf(" Row bound: the lower bound's terms end to end (%.1fs).", t.Bound.Seconds)
}

// gapLine is a wait on the critical path: from the moment the critical steps
// so far had all ended (on the row of the one that ended last) to the next
// critical step's start.
type gapLine struct {
	from, to       time.Time
	fromRow, toRow string
}

// criticalGaps sweeps the critical steps in order of start: a step that
// starts after every earlier one has ended leaves a wait. Steps that overlap
// (a batch of workers) leave none between them.
func criticalGaps(steps []Step, rows map[string]int) []gapLine {
	var crit []Step

	for _, s := range steps {
		if _, ok := rows[s.Row]; s.Critical && ok {
			crit = append(crit, s)
		}
	}

	slices.SortStableFunc(crit, func(a, b Step) int { return a.From.Compare(b.From) })

	var (
		out      []gapLine
		frontier time.Time
		lastRow  string
	)

	for _, s := range crit {
		if !frontier.IsZero() && s.From.Sub(frontier) >= minDrawnGap {
			out = append(out, gapLine{from: frontier, to: s.From, fromRow: lastRow, toRow: s.Row})
		}

		if s.To.After(frontier) {
			frontier, lastRow = s.To, s.Row
		}
	}

	return out
}

// newRunnerIn says whether a runner pod other than the first took the lock
// during the wait g.
func newRunnerIn(steps []Step, g gapLine) bool {
	first := true

	for _, s := range steps {
		if s.Kind != kindRunner {
			continue
		}

		if !first && s.From.After(g.from.Add(-time.Second)) && !s.From.After(g.to) { // the lock's time is to the second
			return true
		}

		first = false
	}

	return false
}

// tickStep is a round number of seconds that puts at most about 15 ticks
// on the axis.
func tickStep(span float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600} {
		if span/s <= 15 {
			return s
		}
	}

	return 1200
}

func esc(s string) string { return html.EscapeString(s) }
