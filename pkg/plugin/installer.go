package plugin

import (
	"github.com/spf13/pflag"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// installerOptions are the installer flags of plan talos and upgrade talos.
type installerOptions struct {
	// InstallerImages is --installer-image (repeatable): IMAGE for every
	// node, NODE=IMAGE for one; none chooses each node's from what it runs.
	InstallerImages []string
	// DropExtensions is --drop-extensions: the nodes whose explicit
	// installer may leave out their schematic and system extensions.
	DropExtensions []string

	installers stages.InstallerFlags
}

// addInstallerFlags binds the installer flags to fs.
func (o *installerOptions) addInstallerFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.InstallerImages, "installer-image", nil,
		"Talos installer REPOSITORY:TAG for every node, or NODE=REPOSITORY:TAG for one (repeatable; default: each node's from what it runs: "+
			"its schematic's Image Factory installer, else its configured one, from Talos 1.14 the factory's of the empty schematic)")
	fs.StringSliceVar(&o.DropExtensions, "drop-extensions", nil,
		"Nodes whose --installer-image may not carry the schematic and system extensions they run: they reboot without them (NODE,...)")
}

// validateInstallers parses the installer flags for target, the value of the
// flag targetFlag.
func (o *installerOptions) validateInstallers(target stages.Version, targetFlag string) error {
	f, err := stages.ParseInstallerFlags(o.InstallerImages, o.DropExtensions, target, targetFlag)
	if err != nil {
		return err
	}

	o.installers = f

	return nil
}
