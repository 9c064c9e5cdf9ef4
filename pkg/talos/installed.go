package talos

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// Installed is what a node's Talos was installed with, beyond its version:
// what an upgrade must carry over for the node to keep running the same
// things after the reboot.
type Installed struct {
	// Platform is the platform Talos runs on ("metal", "aws", ...), from the
	// Version API.
	Platform string
	// SecureBoot is true when the node booted with UEFI SecureBoot (the
	// runtime SecurityState resource).
	SecureBoot bool
	// BootedWithUKI is true when the node booted a UKI with systemd-boot, false when it
	// booted with GRUB (SecurityState bootedWithUKI: the loader entry systemd-boot set).
	BootedWithUKI bool
	// Extensions are the system extensions the node runs (the runtime
	// ExtensionStatus resources, `talosctl get extensions`), by resource ID.
	// An image built by Image Factory carries a virtual one named "schematic"
	// whose version is the schematic ID.
	Extensions []Extension
}

// Extension is one system extension a node runs.
type Extension struct {
	// Name is the extension's name (its manifest's metadata.name), e.g.
	// "iscsi-tools", or "schematic" for Image Factory's virtual extension.
	Name string
	// Version is its version; the schematic ID for "schematic".
	Version string
	// Author is its author; Image Factory writes "Image Factory (<its URL>)".
	Author string
}

// Schematic returns the Image Factory schematic extension, if the node runs
// one: Image Factory adds it to every image it builds, its version the
// schematic ID (Talos 1.14 also surfaces it as the ImageFactorySchematic
// resource, which older Talos does not have).
func (i Installed) Schematic() (Extension, bool) {
	for _, e := range i.Extensions {
		if e.Name == constants.ImageFactorySchematicExtensionName {
			return e, true
		}
	}

	return Extension{}, false
}

// SystemExtensions returns the names of the extensions other than Image
// Factory's virtual schematic one: what a wrong installer would drop.
func (i Installed) SystemExtensions() []string {
	var names []string

	for _, e := range i.Extensions {
		if e.Name != constants.ImageFactorySchematicExtensionName {
			names = append(names, e.Name)
		}
	}

	return names
}

// Installed reads what a node's Talos was installed with: its platform, its
// SecureBoot state and its system extensions (the schematic among them).
// It needs the os:reader role.
func (c *Client) Installed(ctx context.Context, node string) (Installed, error) {
	nodeCtx := client.WithNode(ctx, node)

	var out Installed

	resp, err := c.c.Version(nodeCtx)
	if err != nil {
		return out, nodeErr(node, "version", err)
	}

	if msgs := resp.GetMessages(); len(msgs) > 0 {
		out.Platform = msgs[0].GetPlatform().GetName()
	}

	list, err := safe.StateListAll[*runtime.ExtensionStatus](nodeCtx, c.c.COSI)
	if err != nil {
		return out, nodeErr(node, "list extensions", err)
	}

	type byID struct {
		id string
		e  Extension
	}

	var exts []byID

	for r := range list.All() {
		m := r.TypedSpec().Metadata
		exts = append(exts, byID{id: r.Metadata().ID(), e: Extension{Name: m.Name, Version: m.Version, Author: m.Author}})
	}

	sort.SliceStable(exts, func(i, j int) bool { return exts[i].id < exts[j].id })

	for _, e := range exts {
		out.Extensions = append(out.Extensions, e.e)
	}

	sec, err := safe.StateGetByID[*runtime.SecurityState](nodeCtx, c.c.COSI, runtime.SecurityStateID)

	switch {
	case state.IsNotFoundError(err):
		// Not published: no SecureBoot to keep.
	case err != nil:
		return out, nodeErr(node, "get securitystate", err)
	default:
		out.SecureBoot = sec.TypedSpec().SecureBoot
		out.BootedWithUKI = sec.TypedSpec().BootedWithUKI
	}

	if out.Platform == "" {
		return out, nodeErr(node, "version", errors.New("the reply names no platform"))
	}

	return out, nil
}

// String lists the extensions for a message: "iscsi-tools v0.2.0, drbd 9.2.14".
func (e Extension) String() string {
	return fmt.Sprintf("%s %s", e.Name, e.Version)
}
