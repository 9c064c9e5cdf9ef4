package text

import (
	"fmt"
	"strings"
)

// OneLine folds s onto one line: every run of white space, newlines included,
// becomes one space.
func OneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// Summarize joins problems into one line: the first three, then how many more.
func Summarize(problems []string) string {
	const shown = 3

	if len(problems) <= shown {
		return strings.Join(problems, "; ")
	}

	return fmt.Sprintf("%s; and %d more", strings.Join(problems[:shown], "; "), len(problems)-shown)
}

// SummarizeList joins names into one line: the first five, then how many more.
func SummarizeList(list []string) string {
	const shown = 5

	if len(list) <= shown {
		return strings.Join(list, ", ")
	}

	return fmt.Sprintf("%s and %d more", strings.Join(list[:shown], ", "), len(list)-shown)
}
