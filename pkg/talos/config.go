package talos

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"google.golang.org/grpc"
)

// Options say which talosconfig, context and endpoints to use. The zero
// value searches the default places and uses the config's current context
// and its endpoints.
type Options struct {
	// ConfigPath is the talosconfig file (--talosconfig); empty searches
	// $TALOSCONFIG, ~/.talos/config (or $TALOS_HOME/config), then
	// /var/run/secrets/talos.dev/config, the first that exists.
	ConfigPath string
	// Context is the talosconfig context (--talos-context); empty uses the
	// config's current context.
	Context string
	// Endpoints override the context's endpoints (--talos-endpoints).
	Endpoints []string
	// DialOptions are added to the gRPC connection's own, such as
	// interceptors that count the calls.
	DialOptions []grpc.DialOption
}

// NoTalosconfigError is returned when no talosconfig exists in any of the
// places looked at.
type NoTalosconfigError struct {
	// Looked lists the places, in the order looked, each with why it was
	// not used ("/home/me/.talos/config: not found").
	Looked []string
}

// Error implements error, on one line.
func (e *NoTalosconfigError) Error() string {
	return fmt.Sprintf("no talosconfig found (looked at %s): pass --talosconfig", strings.Join(e.Looked, "; "))
}

// ContextError is returned when the talosconfig has no usable context.
type ContextError struct {
	// Path is the talosconfig file.
	Path string
	// Name is the context asked for ("" when none was and the config has
	// no current context).
	Name string
	// Available lists the config's contexts, sorted.
	Available []string
}

// Error implements error, on one line.
func (e *ContextError) Error() string {
	switch {
	case len(e.Available) == 0:
		return fmt.Sprintf("talosconfig %s has no contexts: pass a talosconfig that has one with --talosconfig", e.Path)
	case e.Name == "":
		return fmt.Sprintf("talosconfig %s has no current context: pass one of %s with --talos-context",
			e.Path, strings.Join(e.Available, ", "))
	default:
		return fmt.Sprintf("talosconfig %s has no context %q: pass one of %s with --talos-context",
			e.Path, e.Name, strings.Join(e.Available, ", "))
	}
}

// FindConfig returns the talosconfig file to use: explicit when given (it
// must exist), otherwise the first of $TALOSCONFIG, ~/.talos/config and
// /var/run/secrets/talos.dev/config that exists, as talosctl searches. When
// none exists it returns a *NoTalosconfigError. Unlike machinery's
// clientconfig.Open, it never creates a file.
func FindConfig(explicit string) (string, error) {
	if explicit != "" {
		if err := usable(explicit); err != nil {
			return "", fmt.Errorf("talosconfig %s: %w: check the --talosconfig path", explicit, err)
		}

		return explicit, nil
	}

	paths, err := clientconfig.GetDefaultPaths()
	if err != nil {
		return "", fmt.Errorf("find the talosconfig: %w: pass --talosconfig", err)
	}

	envPath, fromEnv := os.LookupEnv(constants.TalosConfigEnvVar)

	looked := make([]string, 0, len(paths))

	for i, p := range paths {
		err := usable(p.Path)
		if err == nil {
			return p.Path, nil
		}

		place := p.Path
		if i == 0 && fromEnv && p.Path == envPath {
			place = "$" + constants.TalosConfigEnvVar + "=" + p.Path
		}

		looked = append(looked, place+": "+err.Error())
	}

	return "", &NoTalosconfigError{Looked: looked}
}

// usable checks that path is a regular file that can be read.
func usable(path string) error {
	st, err := os.Stat(path)

	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("not found")
	case err != nil:
		return err
	case st.IsDir():
		return errors.New("is a directory")
	}

	f, err := os.Open(path)
	if err != nil {
		return err
	}

	return f.Close()
}

// loadConfig reads a talosconfig and picks the context: the one asked for,
// else the current one, else the only one.
func loadConfig(path, contextName string) (*clientconfig.Config, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("talosconfig %s: %w", path, err)
	}

	cfg, err := clientconfig.FromBytes(b)
	if err != nil {
		return nil, "", fmt.Errorf("talosconfig %s: not a talosconfig: %w", path, err)
	}

	available := make([]string, 0, len(cfg.Contexts))
	for name := range cfg.Contexts {
		available = append(available, name)
	}

	slices.Sort(available)

	name := contextName
	if name == "" {
		name = cfg.Context
	}

	if name == "" && len(available) == 1 {
		name = available[0]
	}

	if _, ok := cfg.Contexts[name]; !ok || name == "" {
		return nil, "", &ContextError{Path: path, Name: name, Available: available}
	}

	return cfg, name, nil
}
