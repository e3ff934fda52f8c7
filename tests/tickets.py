"""A small user dataset of support tickets (a CSV-style task with its own columns), shared by the
dataset tests: its task YAML and six records, three per label."""

SPEC_YAML = """
name: tickets
kind: classification
source: {type: file, path: unused.csv, text_column: body, label_column: topic, id_column: ticket_id}
split: {test_size: 0.34, seed: 1}
labels: {billing: Billing, outage: Outage}
generation: {instruction: Write a ticket., label_prefix: "Topic: ", text_prefix: "Ticket:"}
icl: {instruction: Classify tickets., input_prefix: "Ticket:", output_prefix: "Topic:"}
"""

ROWS = [
    {"ticket_id": "t1", "body": "invoice charged twice", "topic": "billing"},
    {"ticket_id": "t2", "body": "site is down again", "topic": "outage"},
    {"ticket_id": "t3", "body": "refund please", "topic": "billing"},
    {"ticket_id": "t4", "body": "cannot log in, servers dead", "topic": "outage"},
    {"ticket_id": "t5", "body": "wrong amount on bill", "topic": "billing"},
    {"ticket_id": "t6", "body": "api returns 503", "topic": "outage"},
]
