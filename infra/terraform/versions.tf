terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Tested on 5.100.0 (the committed .terraform.lock.hcl); 6.x changes resource arguments this module
      # was not tested with.
      version = ">= 5.0, < 6.0"
    }
  }
}

provider "aws" {
  region = var.region
}
