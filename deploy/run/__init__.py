"""The run wing (controller, pure): the launch plan (argv and env per host), membership rules, outcomes, the summary, the comm floors, and the report built from a run's files."""
