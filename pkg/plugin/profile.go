package plugin

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"

	"github.com/spf13/pflag"
)

// profiling is the hidden --profile and --profile-output, kubectl's own flags of the
// same names: a command's CPU or memory profile for `go tool pprof`, or its execution
// trace for `go tool trace` (where its time went waiting: the network, the CPU), written
// when the command ends. The plan's cost at thousands of nodes is found with them, not
// guessed.
type profiling struct {
	name   string
	output string

	file *os.File
}

// profileNames are the profiles --profile takes.
const profileNames = "none, cpu, heap, allocs or trace"

func (p *profiling) addFlags(flags *pflag.FlagSet) {
	flags.StringVar(&p.name, "profile", "none", "The profile to write when the command ends: "+profileNames)
	flags.StringVar(&p.output, "profile-output", "profile.pprof", "The file --profile writes")
	_ = flags.MarkHidden("profile")
	_ = flags.MarkHidden("profile-output")
}

// start starts a CPU profile or an execution trace; the other profiles are taken at
// stop.
func (p *profiling) start() error {
	switch p.name {
	case "none", "":
		return nil
	case "cpu", "heap", "allocs", "trace":
	default:
		return fmt.Errorf("--profile %q: pass %s", p.name, profileNames)
	}

	f, err := os.Create(p.output)
	if err != nil {
		return fmt.Errorf("--profile-output: %w", err)
	}

	p.file = f

	switch p.name {
	case "cpu":
		err = pprof.StartCPUProfile(f)
	case "trace":
		err = trace.Start(f)
	}

	if err != nil {
		_ = f.Close()
		p.file = nil

		return fmt.Errorf("--profile %s: %w", p.name, err)
	}

	return nil
}

// stop writes the profile and closes its file. It is safe to call when start was not.
func (p *profiling) stop() error {
	if p.file == nil {
		return nil
	}

	var err error

	switch p.name {
	case "cpu":
		pprof.StopCPUProfile()
	case "trace":
		trace.Stop()
	case "heap":
		runtime.GC() // the heap profile is of the last GC: make it this moment's
		err = pprof.Lookup("heap").WriteTo(p.file, 0)
	case "allocs":
		err = pprof.Lookup("allocs").WriteTo(p.file, 0)
	}

	err = errors.Join(err, p.file.Close())
	p.file = nil

	if err != nil {
		return fmt.Errorf("--profile %s: %w", p.name, err)
	}

	return nil
}
