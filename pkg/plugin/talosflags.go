package plugin

import (
	"github.com/spf13/pflag"
)

// TalosFlags are the flags that say how to reach the Talos API.
type TalosFlags struct {
	// ConfigPath is --talosconfig; "" searches $TALOSCONFIG, ~/.talos/config and
	// /var/run/secrets/talos.dev/config.
	ConfigPath string
	// Context is --talos-context; "" uses the talosconfig's current context.
	Context string
	// Endpoints is --talos-endpoints; empty uses the context's endpoints.
	Endpoints []string
}

// AddFlags binds the Talos flags to fs.
func (f *TalosFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.ConfigPath, "talosconfig", "",
		"Path to the talosconfig (default: $TALOSCONFIG, ~/.talos/config, /var/run/secrets/talos.dev/config)")
	fs.StringVar(&f.Context, "talos-context", "", "The talosconfig context to use (default: its current context)")
	fs.StringSliceVar(&f.Endpoints, "talos-endpoints", nil, "Talos API endpoints to use instead of the context's")
}
