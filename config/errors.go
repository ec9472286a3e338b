package config

import (
	"fmt"
	"strings"
)

// Error is an invalid-configuration error. Key is the dotted config key (or
// "config" for problems with the file itself).
type Error struct {
	Key string
	Msg string
}

// Error renders "config: <key>: <msg>" ("config: <msg>" for the file itself), forced onto
// one line because main prints it verbatim before exiting.
func (e *Error) Error() string {
	if e.Key == "config" {
		return oneLine.Replace("config: " + e.Msg)
	}
	return oneLine.Replace("config: " + e.Key + ": " + e.Msg)
}

var oneLine = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")

func errorf(key, format string, args ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
}
