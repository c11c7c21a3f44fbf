"""Command-line flags of the aws backend: (flag, backend option, click.option kwargs). No heavy imports."""

FLAGS = [
    ("--region", "region", dict(type=str, help="AWS region [default: the boto3 chain: AWS_REGION, ~/.aws/config].")),
    ("--instance-type", "instance_type", dict(type=str, help="EC2 type for every node, or a mix such as 1*p2.xlarge+3*g3.4xlarge [default: g3.4xlarge].")),
    ("--fallback-instance-type", "fallback_instance_types", dict(type=str, multiple=True, help="Type used when the first has no (spot) capacity (repeatable).")),
    ("--ami", "ami", dict(type=str, help="AMI id [default: the region's AWS Deep Learning AMI with PyTorch, via SSM].")),
    ("--subnet", "subnet_id", dict(type=str, help="Subnet to launch into [default: the default VPC's].")),
    ("--security-group", "security_group_id", dict(type=str, help="Existing security group [default: one per run, traffic only inside it].")),
    ("--placement-group", "placement_group", dict(type=str, help="Cluster placement group name; 'auto' creates one per run, 'none' uses none [default: auto].")),
    ("--key-name", "key_name", dict(type=str, help="EC2 key pair for ssh access (optional).")),
    ("--instance-profile", "instance_profile", dict(type=str, help="IAM instance profile the instances use for S3/EC2 [default: scalelab-instance].")),
    ("--bucket", "bucket", dict(type=str, help="S3 bucket for the package, records, logs and checkpoints (required).")),
    ("--spot/--on-demand", "spot", dict(default=None, help="Spot instances (interruptions are resumed from checkpoints) or on-demand [default: on-demand].")),
    ("--max-price", "spot_max_price", dict(type=float, help="Spot: highest USD per instance-hour [default: the on-demand price].")),
    ("--time-limit-min", "timeout_min", dict(type=float, help="Everything is terminated after this many minutes [default: 120].")),
]
