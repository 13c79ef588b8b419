package store

import "github.com/genbox-dev/genbox/internal/protocol"

// The task document moved to package protocol; these names keep the tree building until its
// references are rewritten.
type (
	AttemptRecord   = protocol.AttemptRecord
	Decision        = protocol.Decision
	Delivery        = protocol.Delivery
	DeliveryAttempt = protocol.DeliveryAttempt
	File            = protocol.File
	FileCopy        = protocol.FileCopy
	Generation      = protocol.Generation
	Notice          = protocol.Notice
	Pending         = protocol.Pending
	QueuedEvent     = protocol.QueuedEvent
	Task            = protocol.Task
	TaskError       = protocol.TaskError
)

const (
	BatchOwnerPrefix = protocol.BatchOwnerPrefix
	MaxAttemptLog    = protocol.MaxAttemptLog
	MaxShards        = protocol.MaxShards
	NudgeOwner       = protocol.NudgeOwner
)

var (
	BatchOwner         = protocol.BatchOwner
	DeadLetterID       = protocol.DeadLetterID
	DeliveryLease      = protocol.DeliveryLease
	DueAt              = protocol.DueAt
	FileOf             = protocol.FileOf
	Finalize           = protocol.Finalize
	NoticeOf           = protocol.NoticeOf
	ParseDeadLetterID  = protocol.ParseDeadLetterID
	Shard              = protocol.Shard
	TaskDue            = protocol.TaskDue
	ErrBadDeadLetterID = protocol.ErrBadDeadLetterID
	ErrBadNotice       = protocol.ErrBadNotice
)
