// Package text is how the product says a list or an error in one line: in a
// check row, a pause reason, a node's line in the plan. One place, so that a
// message reads the same whichever package made it.
package text
